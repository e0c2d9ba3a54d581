// Package browser holds the real-browser tests of Atrium's web UI (package
// web): an in-process Atrium (package server: embedded NATS, a node with
// SQLite histories and bubblewrap sandboxes, the gateway) on loopback, and
// Debian's Chromium driven over the DevTools protocol with chromedp, one
// browser context (its own cookies) per user. The package has no code besides
// its tests.
//
// The tests need bubblewrap and Chromium; .ci/deps installs both. Set
// ATRIUM_SCREENSHOTS to a directory to keep the screenshots the tests take.
package browser

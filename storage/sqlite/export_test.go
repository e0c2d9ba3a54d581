package sqlite

// WriteNewNamed exposes writeNew's fallback, which the filesystems the tests
// run on never need.
var WriteNewNamed = writeNewNamed

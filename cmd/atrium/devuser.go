package main

import (
	"os/user"

	"github.com/atriumhq/atrium/session"
)

// DefaultDevUser is the dev identity's user when the operating system names
// nobody.
const DefaultDevUser = "dev"

// devUser is the user the CLI acts as on a dev server when it has no other
// credentials, and the user `atrium dev`'s banner signs the browser in as: the
// same in both, so sessions made with the CLI are in the browser's list. It is
// $USER, else the operating system's name for the current user, else
// DefaultDevUser.
func devUser(getenv func(string) string) string {
	if getenv != nil {
		if u := getenv("USER"); u != "" && session.ValidUser(u) == nil {
			return u
		}
	}
	if u, err := user.Current(); err == nil && u.Username != "" && session.ValidUser(u.Username) == nil {
		return u.Username
	}
	return DefaultDevUser
}

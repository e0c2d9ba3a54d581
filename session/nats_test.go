package session

import (
	"strings"
	"testing"
)

func TestSubjects_PlaceOn(t *testing.T) {
	for name, tc := range map[string]struct {
		prefix, node, want string
	}{
		"config node id":    {node: "atrium-pod-0", want: "atrium.place.node.atrium-pod-0"},
		"underscore":        {node: "node_A1", want: "atrium.place.node.node_A1"},
		"custom prefix":     {prefix: "acme", node: "n1", want: "acme.place.node.n1"},
		"dot escaped":       {node: "host.example", want: "atrium.place.node.host%2Eexample"},
		"wildcards escaped": {node: "a*>b", want: "atrium.place.node.a%2A%3Eb"},
		"space escaped":     {node: "a b", want: "atrium.place.node.a%20b"},
		"percent escaped":   {node: "a%2E", want: "atrium.place.node.a%252E"},
		"utf-8 escaped":     {node: "nœud", want: "atrium.place.node.n%C5%93ud"},
		"empty":             {node: "", want: ""},
	} {
		t.Run(name, func(t *testing.T) {
			s := Subjects{Prefix: tc.prefix}
			got := s.PlaceOn(tc.node)
			if got != tc.want {
				t.Fatalf("PlaceOn(%q) = %q, want %q", tc.node, got, tc.want)
			}
			if got == "" {
				return
			}
			token, ok := strings.CutPrefix(got, s.Place()+".node.")
			if !ok || token == "" || strings.ContainsAny(token, ".*> \t\r\n") {
				t.Fatalf("PlaceOn(%q) = %q: not one subject token under %s.node", tc.node, got, s.Place())
			}
		})
	}
	// Distinct IDs never share a subject, even when one looks escaped.
	seen := map[string]string{}
	for _, n := range []string{"a.b", "a%2Eb", "a%2eb", "a_b", "a-b", "a b", "a*b", "a>b"} {
		subj := Subjects{}.PlaceOn(n)
		if other, dup := seen[subj]; dup {
			t.Errorf("%q and %q share subject %s", n, other, subj)
		}
		seen[subj] = n
	}
}

package config

import (
	"errors"
	"reflect"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"
)

// unknownField matches yaml.v3's message for a key that is not in a struct.
var unknownField = regexp.MustCompile(`field (\S+) not found in type ([\w.]+)`)

// explainUnknownKeys rewrites yaml.v3's "field X not found in type config.T"
// messages of err as "unknown key X in SECTION: did you mean Y?", naming the
// nearest key of that section. Other errors are returned as they are.
func explainUnknownKeys(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	sections := map[string]section{}
	collectSections(reflect.TypeOf(File{}), "", sections)
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = unknownField.ReplaceAllStringFunc(m, func(s string) string {
			sub := unknownField.FindStringSubmatch(s)
			key, typ := sub[1], sub[2]
			sec, ok := sections[strings.TrimPrefix(typ, "config.")]
			if !ok {
				return s
			}
			where := "at the top level"
			if sec.path != "" {
				where = "in " + sec.path
			}
			out := "unknown key " + key + " " + where
			if near := nearest(key, sec.keys); near != "" {
				out += ": did you mean " + near + "?"
			} else {
				out += " (see docs/configuration.md)"
			}
			return out
		})
	}
	return &yaml.TypeError{Errors: msgs}
}

// section is a struct of the configuration: where it is and its keys.
type section struct {
	path string
	keys []string
}

// collectSections records every struct type reachable from t by its name,
// with the first path that reaches it.
func collectSections(t reflect.Type, path string, out map[string]section) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	if _, seen := out[t.Name()]; seen {
		return
	}
	sec := section{path: path}
	out[t.Name()] = sec
	for i := range t.NumField() {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")
		name := tag[0]
		if name == "-" || !f.IsExported() {
			continue
		}
		if len(tag) > 1 && tag[1] == "inline" {
			collectSections(f.Type, path, out)
			sec.keys = append(sec.keys, out[f.Type.Name()].keys...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		sec.keys = append(sec.keys, name)
		child := name
		if path != "" {
			child = path + "." + name
		}
		collectSections(f.Type, child, out)
	}
	out[t.Name()] = sec
}

// nearest returns the key of keys closest to key, if it is close enough to
// be a likely misspelling (an edit distance of at most a third of its
// length, and at least 1 or 2), else a key that starts the same way.
func nearest(key string, keys []string) string {
	key = strings.ToLower(key)
	best, bestD := "", -1
	for _, k := range keys {
		if d := editDistance(key, k); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	if bestD >= 0 && bestD <= max(2, len(key)/3) {
		return best
	}
	// listen_addr for listen, cookie for cookie_key.
	for _, k := range keys {
		if len(k) >= 4 && len(key) >= 4 && (strings.HasPrefix(key, k) || strings.HasPrefix(k, key)) {
			return k
		}
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

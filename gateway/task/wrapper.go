package task

import (
	"strings"

	"github.com/atriumhq/atrium/session"
)

// Secrets a task sets on its session while its turn runs, and deletes when
// the turn ends. The wrapper hands them to git through a credential helper
// and removes them from the inner harness's environment.
const (
	SecretToken    = "TASK_GIT_TOKEN"
	SecretUsername = "TASK_GIT_USERNAME"
)

// ExitTransient is the wrapper's exit code when git could not reach the
// repository (clone, fetch or push failed): worth retrying (EX_TEMPFAIL).
const ExitTransient = 75

// ResultType is the "type" of the wrapper's last stdout line:
// {"type":"task_result","changes":BOOL,"branch":…,"commit":…}.
const ResultType = "task_result"

// wrapperScript is the task wrapper, run by bash as the session's harness
// with the arguments of wrapperArgv. It follows the harness contract
// (DESIGN §6): the first stdin line is the turn's input. It clones the
// repository into /workspace on the first run, puts the work on the task's
// branch, runs the inner harness with the contract's stdin, and commits and
// pushes what changed. The git credential comes from the environment (the
// session's secrets) through a credential helper: it is never in an argv,
// a URL or a file. Git reaches the repository through the egress proxy even
// when the repository's host is the node's own loopback (NO_PROXY is
// cleared for git alone).
const wrapperScript = `set -uo pipefail
repo=$1 base=$2 branch=$3 name=$4 email=$5 message=$6 kind=$7
shift 7
IFS= read -r input || { echo "task: no harness input on stdin" >&2; exit 2; }

export GIT_TERMINAL_PROMPT=0 GIT_ASKPASS=/bin/false
helper='!f() { test "$1" = get || exit 0; echo "username=${TASK_GIT_USERNAME:-x-access-token}"; echo "password=${TASK_GIT_TOKEN:-}"; }; f'
gitnet() { env -u NO_PROXY -u no_proxy git -c credential.helper= -c "credential.helper=$helper" "$@"; }

# utf8 appends code point $1 to out, as UTF-8.
utf8() {
	local c=$1 f
	if ((c == 0)); then return; fi
	if ((c < 0x80)); then printf -v f '\\x%02x' "$c"
	elif ((c < 0x800)); then printf -v f '\\x%02x\\x%02x' $((0xC0 | c >> 6)) $((0x80 | (c & 0x3F)))
	else printf -v f '\\x%02x\\x%02x\\x%02x' $((0xE0 | c >> 12)) $((0x80 | (c >> 6 & 0x3F))) $((0x80 | (c & 0x3F)))
	fi
	printf -v f "$f"
	out+=$f
}

# prompt prints the "prompt" string of the harness input line $1, decoded.
prompt() {
	local LC_ALL=C s=${1#*\"prompt\":\"} out= pre c
	while :; do
		pre=${s%%[\\\"]*}
		out+=$pre
		s=${s:${#pre}}
		case ${s:0:1} in '"' | '') break ;; esac
		c=${s:1:1}
		s=${s:2}
		case $c in
		n) out+=$'\n' ;; t) out+=$'\t' ;; r) out+=$'\r' ;; b) out+=$'\b' ;; f) out+=$'\f' ;;
		u) utf8 $((16#${s:0:4})); s=${s:4} ;;
		*) out+=$c ;;
		esac
	done
	printf '%s' "$out"
}

if [ ! -d .git ]; then
	echo "task: cloning $repo"
	gitnet clone --quiet --no-checkout -- "$repo" . || { echo "task: could not clone $repo (see above)" >&2; exit 75; }
	git config user.name "$name"
	git config user.email "$email"
fi
if ! git rev-parse --verify -q "refs/heads/$branch" >/dev/null; then
	git rev-parse --verify -q "refs/remotes/origin/$base" >/dev/null ||
		{ echo "task: $repo has no branch $base: give an existing base branch" >&2; exit 2; }
	git checkout --quiet -B "$branch" "origin/$base" || exit 2
else
	git checkout --quiet "$branch" || exit 2
fi
echo "task: working on branch $branch from $base"

case $kind in
shell)
	text=$(prompt "$input")
	printf '%s\n' "$input" | env -u TASK_GIT_TOKEN -u TASK_GIT_USERNAME ATRIUM_PROMPT="$text" \
		bash -lc 'IFS= read -r _atrium_input; eval "$ATRIUM_PROMPT"'
	;;
*)
	env -u TASK_GIT_TOKEN -u TASK_GIT_USERNAME "$@" < <(printf '%s\n' "$input"; exec cat 2>/dev/null)
	;;
esac
rc=$?
if [ "$rc" -ne 0 ]; then
	echo "task: the harness exited with status $rc: nothing was committed or pushed" >&2
	exit "$rc"
fi

git add -A
if ! git diff --cached --quiet; then
	git commit --quiet -m "$message" || { echo "task: could not commit" >&2; exit 2; }
fi
if [ "$(git rev-list --count "origin/$base..HEAD")" = 0 ]; then
	echo "Nothing to do: the task left no changes, so no branch was pushed and no pull request will be opened."
	printf '{"type":"task_result","changes":false}\n'
	exit 0
fi
gitnet push --quiet --force origin "HEAD:refs/heads/$branch" || { echo "task: could not push $branch (see above)" >&2; exit 75; }
printf '{"type":"task_result","changes":true,"branch":"%s","commit":"%s"}\n' "$branch" "$(git rev-parse HEAD)"
`

// wrapperHarness returns the session harness of a task: bash running the
// wrapper with its arguments, then the inner harness ("shell", or "command"
// followed by its argv).
func wrapperHarness(repo, base, branch, name, email, message string, inner session.Harness) session.Harness {
	argv := []string{"bash", "-c", wrapperScript, "atrium-task", repo, base, branch, name, email, message}
	if len(inner.Command) > 0 {
		argv = append(append(argv, "command"), inner.Command...)
	} else {
		argv = append(argv, "shell")
	}
	return session.Harness{Command: argv}
}

// firstLine returns the first non-empty line of s, trimmed.
func firstLine(s string) string {
	for line := range strings.SplitSeq(s, "\n") {
		if t := strings.TrimSpace(line); t != "" {
			return t
		}
	}
	return ""
}

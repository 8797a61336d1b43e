#!/bin/sh
# Wraps a coding agent in the director's run contract (README, "The run contract"): clone the
# repository, run the agent on the task in the checkout, commit what it changed, push the run's
# branch, and write the result file. POSIX sh: it runs under dash, bash or busybox.
#
#   AGENT_COMMAND   the agent, run by `sh -c` in the checkout with the prompt on standard input
#                   and in $AGENT_PROMPT_FILE; its output is its summary. Default: Claude Code.
#
# git needs nothing from the agent: the director gives it the run token through a credential
# helper. This script never prints the token and never puts it in a URL or a file.
set -eu

for name in DIRECTOR_CLONE_URL DIRECTOR_BRANCH DIRECTOR_BASE_BRANCH DIRECTOR_TASK_FILE DIRECTOR_REPO DIRECTOR_ISSUE; do
  eval "value=\${$name:-}"
  if [ -z "$value" ]; then
    echo "entrypoint: $name is not set: this image runs under the director" >&2
    exit 2
  fi
done

work=$(pwd)
checkout="$work/checkout"
output="$work/agent-output.txt"
export AGENT_PROMPT_FILE="$work/prompt.md"
: "${AGENT_COMMAND:=claude -p --dangerously-skip-permissions \"\$(cat \"\$AGENT_PROMPT_FILE\")\"}"

# $1: a file. Its text as one JSON string, control characters dropped, at most 16 KB.
json_string() {
  head -c 16384 "$1" | tr -d '\000-\010\013\014\016-\037' | awk '
    function esc(s,    out, i, c) {
      out = ""
      for (i = 1; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "\\") out = out "\\\\"
        else if (c == "\"") out = out "\\\""
        else if (c == "\t") out = out "\\t"
        else if (c == "\r") out = out "\\r"
        else out = out c
      }
      return out
    }
    BEGIN { ORS = ""; printf "\"" }
    {
      if (NR > 1) printf "\\n"
      printf "%s", esc($0)
    }
    END { printf "\"" }'
}

# $1: done | blocked; $2: the reason when blocked. Only when the director asks for a result.
write_result() {
  [ -n "${DIRECTOR_RESULT_FILE:-}" ] || return 0
  printf '%s' "$2" > "$work/.reason"
  {
    printf '{"outcome":"%s",' "$1"
    [ "$1" = blocked ] && printf '"reason":%s,' "$(json_string "$work/.reason")"
    printf '"summary":%s}\n' "$(json_string "$output")"
  } > "$DIRECTOR_RESULT_FILE"
}

echo "entrypoint: cloning $DIRECTOR_REPO"
git clone --quiet "$DIRECTOR_CLONE_URL" "$checkout"
cd "$checkout"
if git ls-remote --exit-code --heads origin "$DIRECTOR_BRANCH" >/dev/null 2>&1; then
  # A follow-up run: continue the branch of the open pull request.
  git fetch --quiet origin "$DIRECTOR_BRANCH"
  git checkout --quiet -B "$DIRECTOR_BRANCH" FETCH_HEAD
else
  git checkout --quiet -B "$DIRECTOR_BRANCH" "origin/$DIRECTOR_BASE_BRANCH"
fi
start=$(git rev-parse HEAD)

{
  cat "$DIRECTOR_TASK_FILE"
  printf '\n## How to work\n\nYou are in a git checkout of %s on branch %s. Make the change the issue asks for, keeping to the repository'"'"'s style, and run its tests if it has any. Do not commit, push or open a pull request: the wrapper and the director do that. Finish with a short summary, in Markdown, of what you changed and why. If you find that the work cannot or should not be done, change nothing and say why.\n' "$DIRECTOR_REPO" "$DIRECTOR_BRANCH"
} > "$AGENT_PROMPT_FILE"

echo "entrypoint: running the agent"
status=0
sh -c "$AGENT_COMMAND" < "$AGENT_PROMPT_FILE" > "$output" 2>&1 || status=$?
cat "$output"
if [ "$status" -ne 0 ]; then
  echo "entrypoint: the agent exited with $status" >&2
  exit "$status"
fi

git add -A
if ! git diff --cached --quiet; then
  title=$(sed -n 's/^# //p' "$DIRECTOR_TASK_FILE" | head -n 1)
  git commit --quiet -m "${title:-Work on issue #$DIRECTOR_ISSUE}" -m "Issue #$DIRECTOR_ISSUE, run $DIRECTOR_RUN_ID."
fi
if [ "$(git rev-list --count "$start..HEAD")" -eq 0 ]; then
  echo "entrypoint: the agent changed nothing"
  write_result blocked "the agent changed nothing"
  exit 0
fi
git push --quiet origin "HEAD:refs/heads/$DIRECTOR_BRANCH"
echo "entrypoint: pushed $DIRECTOR_BRANCH"
write_result done ""

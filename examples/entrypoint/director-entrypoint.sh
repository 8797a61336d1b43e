#!/bin/sh
# Wraps a coding agent in the director's run contract (docs/run-contract.md), for every example
# image: clone the repository, run the agent on the task in the checkout with its output
# streamed as it comes (the transcript is live, the idle timeout sees it work), commit what it
# changed in the repository, push the run's branch, and write the result file. On SIGTERM (a
# timeout, an idle or budget stop) the agent is stopped and the work so far is pushed within
# the grace. POSIX sh: it runs under dash, bash or busybox.
#
#   AGENT_COMMAND  the agent, run by `sh -c` in the checkout with the prompt on standard
#                  input and in $AGENT_PROMPT_FILE. Default: Claude Code.
#   AGENT_EXCLUDE  patterns of the agent's scratch files (space-separated), kept out of the
#                  commit through .git/info/exclude; the repository's .gitignore is never
#                  edited.
#
# git needs nothing from the agent: the director's credential helper answers it. This script
# never prints a credential and never puts one in a URL or a file.
set -eu

if ! command -v git >/dev/null 2>&1; then
  echo "entrypoint: git is not in this image; the run contract needs git and a POSIX shell" >&2
  exit 3
fi
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
: "${AGENT_EXCLUDE:=}"

# $1: a file. Its last 8 KB as one JSON string, control characters dropped.
json_string() {
  tail -c 8192 "$1" | tr -d '\000-\010\013\014\016-\037' | awk '
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

if [ -n "${DIRECTOR_PREPARED:-}" ] && [ -d "$checkout/.git" ]; then
  # The repository's setup prepared the workspace (cold, or warm from a snapshot): the
  # checkout is there with its dependencies; bring it up to date.
  echo "entrypoint: the workspace was prepared ($DIRECTOR_PREPARED); fetching $DIRECTOR_REPO"
  cd "$checkout"
  git fetch --quiet origin
else
  echo "entrypoint: cloning $DIRECTOR_REPO"
  git clone --quiet "$DIRECTOR_CLONE_URL" "$checkout"
  cd "$checkout"
fi
if git ls-remote --exit-code --heads origin "$DIRECTOR_BRANCH" >/dev/null 2>&1; then
  # A follow-up run: continue the branch of the open pull request.
  git fetch --quiet origin "$DIRECTOR_BRANCH"
  git checkout --quiet -B "$DIRECTOR_BRANCH" FETCH_HEAD
else
  git checkout --quiet -B "$DIRECTOR_BRANCH" "origin/$DIRECTOR_BASE_BRANCH"
fi
start=$(git rev-parse HEAD)
# The agent's scratch files stay out of the commit, without touching the repository's files.
for pattern in $AGENT_EXCLUDE; do
  printf '%s\n' "$pattern" >> .git/info/exclude
done

{
  cat "$DIRECTOR_TASK_FILE"
  printf '\n## How to work\n\nYou are in a git checkout of %s on branch %s. Make the change the issue asks for, keeping to the repository'"'"'s style, and run its tests if it has any. Do not commit, push or open a pull request: the wrapper and the director do that. Finish with a short summary, in Markdown, of what you changed and why. If you find that the work cannot or should not be done, change nothing and say why.\n' "$DIRECTOR_REPO" "$DIRECTOR_BRANCH"
} > "$AGENT_PROMPT_FILE"

# Commits what the agent changed (with $1 added to the message) and pushes the branch when it
# is ahead of where the run started; says whether it pushed.
push_work() {
  git add -A
  if ! git diff --cached --quiet; then
    title=$(sed -n 's/^# //p' "$DIRECTOR_TASK_FILE" | head -n 1)
    git commit --quiet -m "${title:-Work on issue #$DIRECTOR_ISSUE}$1" -m "Issue #$DIRECTOR_ISSUE, run ${DIRECTOR_RUN_ID:-}."
  fi
  if [ "$(git rev-list --count "$start..HEAD")" -eq 0 ]; then
    return 1
  fi
  git push --quiet origin "HEAD:refs/heads/$DIRECTOR_BRANCH"
  echo "entrypoint: pushed $DIRECTOR_BRANCH"
}

echo "entrypoint: running the agent"
# The agent's output goes through a pipe to tee as it comes: to the director's log (its
# transcript) and to the file its summary is read from. The agent gets a process group of its
# own (setsid), so a stop reaches every program it started, and none left behind holds the
# pipe open.
fifo="$work/.agent-output"
rm -f "$fifo"
mkfifo "$fifo"
tee "$output" < "$fifo" &
tee_pid=$!
stopped=""
# $1: a signal. To the agent's whole group (dash takes `--` before a group, busybox does
# not), or to the agent alone without setsid.
signal_agent() {
  kill -s "$1" -- "-$agent_pid" 2>/dev/null \
    || kill -s "$1" "-$agent_pid" 2>/dev/null \
    || kill -s "$1" "$agent_pid" 2>/dev/null \
    || true
}
trap 'stopped=1; signal_agent TERM' TERM INT
if command -v setsid >/dev/null 2>&1; then
  setsid sh -c "$AGENT_COMMAND" < "$AGENT_PROMPT_FILE" > "$fifo" 2>&1 &
else
  sh -c "$AGENT_COMMAND" < "$AGENT_PROMPT_FILE" > "$fifo" 2>&1 &
fi
agent_pid=$!
status=0
wait "$agent_pid" || status=$?
if [ -n "$stopped" ]; then
  # The stop interrupted the wait: the agent gets the rest of the grace to end.
  wait "$agent_pid" 2>/dev/null || true
fi
# Whatever the agent left running is ended, so the pipe closes and tee is done.
signal_agent TERM
wait "$tee_pid" 2>/dev/null || true
rm -f "$fifo"

if [ -n "$stopped" ]; then
  echo "entrypoint: stopped; pushing the work so far"
  if push_work " (stopped before it finished)"; then
    write_result done ""
  else
    write_result blocked "stopped before the agent changed anything"
  fi
  exit 143
fi
if [ "$status" -ne 0 ]; then
  echo "entrypoint: the agent exited with $status" >&2
  exit "$status"
fi
if ! push_work ""; then
  echo "entrypoint: the agent changed nothing"
  write_result blocked "the agent changed nothing"
  exit 0
fi
write_result done ""

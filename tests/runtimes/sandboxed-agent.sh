#!/bin/sh
# Plays the agent in the sandbox tests (tests/api/sandbox.rs), with curl and git only (busybox's
# static wget fails under gVisor). Says which kernel it runs on; calls the model through the
# director's model gateway with the run's own key; with "reach: <host:port>" in its task, asks
# that destination through the egress proxy and fails (exit 3) when refused; then clones
# through the git gateway, commits and pushes its branch.
exec 2>&1
echo "agent: run $DIRECTOR_RUN_ID kernel $(uname -r)"
if [ -n "${ANTHROPIC_BASE_URL:-}" ]; then
  out=$(curl -sS --noproxy '*' -m 20 -H "x-api-key: $ANTHROPIC_API_KEY" \
    -H "anthropic-version: 2023-06-01" -H "Content-Type: application/json" \
    -d '{"model":"claude-fake-1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}' \
    "$ANTHROPIC_BASE_URL/v1/messages" 2>&1) || { echo "the model call failed: $out"; exit 1; }
  case "$out" in *input_tokens*) echo "the model answered" ;; *) echo "no answer: $out"; exit 1 ;; esac
fi
reach=$(sed -n 's/.*reach: \([0-9a-z.:-]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
if [ -n "$reach" ]; then
  if curl -fsS -m 10 -o /dev/null "http://$reach/agent.sh"; then
    echo "reached $reach"
  else
    echo "refused $reach"
    exit 3
  fi
fi
git clone --quiet "$DIRECTOR_CLONE_URL" repo || { echo "clone failed"; exit 1; }
cd repo || exit 1
echo "sandboxed" > sandboxed.txt
git add sandboxed.txt && git commit --quiet -m "work in the sandbox" || { echo "commit failed"; exit 1; }
git push --quiet origin "HEAD:$DIRECTOR_BRANCH" || { echo "push failed"; exit 1; }
echo "pushed $DIRECTOR_BRANCH"

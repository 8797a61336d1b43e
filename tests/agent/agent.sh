#!/bin/sh
# Plays the coding agent in the runtime tests. The issue body picks the behaviour:
# "mode: <name>" (default: push a branch through the API with the run token).
mode=$(sed -n 's/.*mode: \([a-z-]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
echo "agent: run $DIRECTOR_RUN_ID for $DIRECTOR_REPO#$DIRECTOR_ISSUE mode=${mode:-default} uid=$(id -u)"

push() {
  body='{"content":"aGVsbG8K","message":"agent work","branch":"'"$DIRECTOR_BASE_BRANCH"'","new_branch":"'"$DIRECTOR_BRANCH"'"}'
  timeout 20 wget -q -O /dev/null --header "Authorization: token $DIRECTOR_TOKEN" \
    --header "Content-Type: application/json" --post-data "$body" \
    "$DIRECTOR_API_URL/repos/$1/contents/agent.txt"
}

case "$mode" in
  nobranch) echo "nothing to do"; exit 0 ;;
  sleep) sleep 600; exit 0 ;;
  slow) sleep 3 ;;
  leak) echo "my token is $DIRECTOR_TOKEN"; exit 3 ;;
  other)
    # The run token must be refused on any other repository: only then push our own.
    if push acme/other; then echo "other repository accepted the token"; exit 0; fi
    echo "other repository refused the token"
    ;;
esac
push "$DIRECTOR_REPO" || { echo "push failed"; exit 1; }
echo "pushed $DIRECTOR_BRANCH"

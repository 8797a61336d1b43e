#!/bin/sh
# The demo's coding agent: reads its task, says what it would do, and pushes one file to its
# branch through the forge's API with the run token (a real agent would clone and push with
# git; see examples/claude-code).
echo "agent: run $DIRECTOR_RUN_ID for $DIRECTOR_REPO#$DIRECTOR_ISSUE, as uid $(id -u)"
echo "agent: the task says: $(sed -n 's/^# //p' "$DIRECTOR_TASK_FILE" | head -n 1)"
content=$(printf 'verbose = true\n' | base64)
# The run's branch lives where its clone URL points: the runner's fork (owner/name).
home=$(echo "$DIRECTOR_CLONE_URL" | sed -e 's#\.git$##' -e 's#.*/\([^/]*/[^/]*\)$#\1#')
body='{"content":"'"$content"'","message":"Add a --verbose flag","branch":"'"$DIRECTOR_BASE_BRANCH"'","new_branch":"'"$DIRECTOR_BRANCH"'"}'
if wget -q -O /dev/null --header "Authorization: token $DIRECTOR_TOKEN" \
    --header "Content-Type: application/json" --post-data "$body" \
    "$DIRECTOR_API_URL/repos/$home/contents/VERBOSE.md"; then
  echo "agent: pushed $DIRECTOR_BRANCH to $home"
else
  echo "agent: the push failed"
  exit 1
fi

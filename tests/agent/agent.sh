#!/bin/sh
# Plays the coding agent in the runtime tests. The issue body picks the behaviour:
# "mode: <name>" (default: push a branch through the API with the run token).
mode=$(sed -n 's/.*mode: \([a-z-]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
echo "agent: run $DIRECTOR_RUN_ID for $DIRECTOR_REPO#$DIRECTOR_ISSUE mode=${mode:-default} uid=$(id -u)"

push() {
  body='{"content":"aGVsbG8K","message":"agent work","branch":"'"$DIRECTOR_BASE_BRANCH"'","new_branch":"'"$DIRECTOR_BRANCH"'"}'
  # A follow-up adds a commit to the pull request's branch.
  [ -n "$DIRECTOR_PR" ] && body='{"content":"Zml4ZWQK","message":"answer the review","branch":"'"$DIRECTOR_BRANCH"'"}'
  timeout 20 wget -q -O /dev/null --header "Authorization: token $DIRECTOR_TOKEN" \
    --header "Content-Type: application/json" --post-data "$body" \
    "$DIRECTOR_API_URL/repos/$1/contents/agent.txt"
}

# Clone, commit and push with plain git (the image has git): to the run's branch, or, in
# git-main, to the default branch, which the forge must refuse. While git pushes, every
# process's arguments are watched; afterwards the trace, .git and the clone URL are searched:
# the credential git was given (the forge token with open egress, the gateway's password
# when confined) must be in none of them. A leak makes the run fail.
with_git() {
  secret="${DIRECTOR_TOKEN:-$DIRECTOR_GIT_PASSWORD}"
  [ -n "$secret" ] || { echo "no credential for git"; exit 1; }
  git clone --quiet "$DIRECTOR_CLONE_URL" repo || { echo "clone failed"; exit 1; }
  cd repo || exit 1
  echo "agent work" > agent.txt
  git add agent.txt && git commit --quiet -m "agent work" || { echo "commit failed"; exit 1; }
  target="$DIRECTOR_BRANCH"
  [ "$mode" = git-main ] && target="$DIRECTOR_BASE_BRANCH"
  GIT_TRACE="$HOME/trace" git push origin "HEAD:$target" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' ' >> "$HOME/cmdlines"
  done
  pushed=0
  wait "$pid" || pushed=$?
  leak=""
  grep -qF "$secret" "$HOME/trace" && leak="$leak trace"
  grep -qF "$secret" "$HOME/cmdlines" && leak="$leak arguments"
  grep -rqF "$secret" .git && leak="$leak .git"
  case "$DIRECTOR_CLONE_URL" in *"$secret"*) leak="$leak clone-url" ;; esac
  grep -q "remote-http" "$HOME/trace" || leak="$leak (no trace: the check saw nothing)"
  if [ -n "$leak" ]; then
    echo "LEAK:$leak"
    git push --quiet origin ":$target"
    exit 7
  fi
  [ "$pushed" -eq 0 ] || { echo "push failed"; exit 1; }
  echo "pushed $target with git"
  exit 0
}

# Behind the egress proxy (runner.egress = "allowlist"): the allowed destination answers
# through the proxy, the refused one does not, neither answers without the proxy; then the
# forge, through the proxy, with plain git.
egress() {
  allowed=$(sed -n 's/.*allowed: \([0-9.:]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
  refused=$(sed -n 's/.*refused: \([0-9.:]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
  fail=""
  timeout 10 wget -q -O /dev/null "http://$allowed/agent.sh" || fail="$fail allowed-not-reached"
  timeout 10 wget -q -O /dev/null "http://$refused/" && fail="$fail refused-reached"
  timeout 5 wget -q -Y off -O /dev/null "http://$allowed/agent.sh" && fail="$fail direct-reached"
  timeout 5 wget -q -Y off -O /dev/null "http://$refused/" && fail="$fail direct-refused-reached"
  if [ -n "$fail" ]; then
    echo "EGRESS:$fail"
    exit 1
  fi
  echo "egress: allowed through the proxy, refused through it, no direct route"
  with_git
}

# As a prompt-injected agent would, behind the git gateway: after pushing its own branch it
# tries another branch, a tag, a delete and a CI workflow. Each must be refused in git's own
# words; any that is not fails the run.
escape() {
  git clone --quiet "$DIRECTOR_CLONE_URL" repo || { echo "clone failed"; exit 1; }
  cd repo || exit 1
  echo "agent work" > agent.txt
  git add agent.txt && git commit --quiet -m "agent work" || { echo "commit failed"; exit 1; }
  git push --quiet origin "HEAD:$DIRECTOR_BRANCH" || { echo "push failed"; exit 1; }
  fail=""
  refused() {
    if git push origin "$@" > "$HOME/out" 2>&1; then fail="$fail $1(accepted)"; return; fi
    grep -q "remote rejected" "$HOME/out" || fail="$fail $1(no-reason)"
    cat "$HOME/out"
  }
  refused HEAD:other
  git tag v1 && refused v1
  refused ":$DIRECTOR_BRANCH"
  mkdir -p .forgejo/workflows && echo "on: push" > .forgejo/workflows/x.yml
  git add .forgejo && git commit --quiet -m "ci" && refused "HEAD:$DIRECTOR_BRANCH"
  if [ -n "$fail" ]; then
    echo "ESCAPED:$fail"
    exit 1
  fi
  echo "every escape was refused"
  exit 0
}

# Calls the model through the director's model gateway with the run's own key, as an agent
# CLI would (ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY): a whole answer, a stream, then one more
# that the spent budget must refuse; then it works on until it is stopped, claiming in its
# result file to have used nothing.
model() {
  call() {
    timeout 20 wget -q -Y off -O - --header "x-api-key: $ANTHROPIC_API_KEY" \
      --header "anthropic-version: 2023-06-01" --header "Content-Type: application/json" \
      --post-data '{"model":"claude-fake-1","max_tokens":8,"stream":'"$1"',"messages":[{"role":"user","content":"hi"}]}' \
      "$ANTHROPIC_BASE_URL/v1/messages" 2>&1
  }
  out=$(call false) || { echo "the first call failed: $out"; exit 1; }
  case "$out" in *'"input_tokens":1000'*) echo "answered" ;; *) echo "no answer: $out"; exit 1 ;; esac
  out=$(call true) || { echo "the stream failed: $out"; exit 1; }
  case "$out" in *message_stop*) echo "streamed" ;; *) echo "no stream: $out"; exit 1 ;; esac
  if out=$(call false); then echo "the budget was not enforced"; exit 1; fi
  case "$out" in *429*) echo "refused: over budget" ;; *) echo "refused otherwise: $out"; exit 1 ;; esac
  printf '%s' '{"outcome":"done","usage":{"input_tokens":1,"output_tokens":1,"cost_usd":0}}' \
    > "$DIRECTOR_RESULT_FILE"
  trap 'echo "stopped"; exit 0' TERM
  while true; do sleep 1; done
}

# A prepared workspace (a `[setup]` ran before this): the setup's work is there, the
# checkout the setup cloned is reused, the package index the setup reached is out of reach
# and the setup's secret (the task names it, as the test knows it) is in no variable and no
# file. Then it commits and pushes in the prepared checkout.
prepared() {
  secret=$(sed -n 's/.*secret: \([A-Za-z0-9-]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
  index=$(sed -n 's/.*index: \([0-9.:]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
  fail=""
  [ "$DIRECTOR_PREPARED" = cold ] || [ "$DIRECTOR_PREPARED" = warm ] || fail="$fail not-prepared"
  grep -q "installed-package" "$HOME/.cache/pkg/pkg.txt" 2>/dev/null || fail="$fail package-missing"
  [ -d "$HOME/checkout/.git" ] || fail="$fail no-checkout"
  env | grep -qF "$secret" && fail="$fail secret-in-env"
  grep -rqF "$secret" "$HOME" 2>/dev/null && fail="$fail secret-in-files"
  timeout 10 wget -q -O /dev/null "http://$index/pkg" && fail="$fail index-reached"
  if [ -n "$fail" ]; then
    echo "PREPARED:$fail"
    exit 1
  fi
  echo "prepared: $DIRECTOR_PREPARED, package installed, index out of reach, no secret"
  cd "$HOME/checkout" || exit 1
  git fetch --quiet origin || { echo "fetch failed"; exit 1; }
  git checkout --quiet -B "$DIRECTOR_BRANCH" "origin/$DIRECTOR_BASE_BRANCH" || exit 1
  echo "agent work" > agent.txt
  git add agent.txt && git commit --quiet -m "agent work" || { echo "commit failed"; exit 1; }
  git push --quiet origin "HEAD:$DIRECTOR_BRANCH" || { echo "push failed"; exit 1; }
  echo "pushed $DIRECTOR_BRANCH"
  exit 0
}

# For the director's checks: `calc.sh` prints the number the task names ("calc: 5"; the
# repository's test wants 4), a follow-up whose feedback names the failing test puts 4 back.
# Pushed with git through the gateway, to the run's branch (a follow-up's, fetched first).
calc() {
  git clone --quiet "$DIRECTOR_CLONE_URL" repo || { echo "clone failed"; exit 1; }
  cd repo || exit 1
  if git fetch --quiet origin "$DIRECTOR_BRANCH" 2>/dev/null; then
    git checkout --quiet -B "$DIRECTOR_BRANCH" FETCH_HEAD || exit 1
  fi
  if grep -q "FAIL: 2+2" "$DIRECTOR_TASK_FILE"; then
    value=4
    echo "the checks' feedback names the failing test: putting 4 back"
  else
    value=$(sed -n 's/.*calc: \([0-9]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
  fi
  echo "echo $value" > calc.sh
  echo "agent work $value" > agent.txt
  # "delete: <path>": the agent that deletes the test it broke.
  gone=$(sed -n 's/.*delete: \([A-Za-z0-9_./-]*\).*/\1/p' "$DIRECTOR_TASK_FILE" | head -n 1)
  [ -n "$gone" ] && git rm --quiet "$gone"
  git add -A && git commit --quiet -m "calc prints $value" || { echo "commit failed"; exit 1; }
  git push --quiet origin "HEAD:$DIRECTOR_BRANCH" || { echo "push failed"; exit 1; }
  echo "pushed calc $value"
  exit 0
}

case "$mode" in
  prepared) prepared ;;
  calc) calc ;;
  git|git-main) with_git ;;
  model) model ;;
  escape) escape ;;
  egress) egress ;;
  result)
    # The run's own account, left where the director reads it after the container ends.
    printf '%s' '{"outcome":"done","summary":"Wrote agent.txt.","usage":{"input_tokens":321,"output_tokens":45}}' \
      > "$DIRECTOR_RESULT_FILE" || { echo "cannot write the result file"; exit 1; }
    ;;
  grace)
    # Works silently; at the stop signal it pushes what it has and ends.
    trap 'push "$DIRECTOR_REPO" && echo "pushed at the stop signal"; exit 0' TERM
    while true; do sleep 1; done
    ;;
  nobranch) echo "nothing to do"; exit 0 ;;
  sleep) sleep 600; exit 0 ;;
  slow) sleep 3 ;;
  chatty)
    # Talks for a few seconds, a numbered line at a time (a transcript to follow).
    i=1
    while [ "$i" -le 15 ]; do echo "chatty line $i"; i=$((i + 1)); sleep 0.2; done
    ;;
  leak) echo "my token is $DIRECTOR_TOKEN"; exit 3 ;;
  other)
    # The run token must be refused on any other repository: only then push our own.
    if push acme/other; then echo "other repository accepted the token"; exit 0; fi
    echo "other repository refused the token"
    ;;
esac
push "$DIRECTOR_REPO" || { echo "push failed"; exit 1; }
echo "pushed $DIRECTOR_BRANCH"

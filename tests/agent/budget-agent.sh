#!/bin/sh
# Plays an agent under the example entrypoint that works until its model budget is spent
# (tests/api/continues.rs). It writes its part of the work, calls the model through the
# director's model gateway with the run's own key until the gateway refuses, says how many
# calls were answered, and works on until it is stopped: the entrypoint then commits and
# pushes what it wrote. A run that continues a stopped one (its task says so) finds the first
# part on its branch and writes the second.
prompt=$(cat)
if printf '%s\n' "$prompt" | grep -q '^## Going on where run'; then
  if [ -f part-one.txt ]; then echo "found part one on the branch"; else echo "part one is missing"; fi
  echo "part two" > part-two.txt
else
  echo "part one" > part-one.txt
fi
answered=0
while [ "$answered" -lt 40 ]; do
  timeout 20 wget -q -Y off -O /dev/null --header "x-api-key: $ANTHROPIC_API_KEY" \
    --header "anthropic-version: 2023-06-01" --header "Content-Type: application/json" \
    --post-data '{"model":"claude-fake-1","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}' \
    "$ANTHROPIC_BASE_URL/v1/messages" 2> /tmp/wget.err || break
  answered=$((answered + 1))
done
echo "calls answered: $answered"
echo "then: $(tr '\n' ' ' < /tmp/wget.err)"
while :; do sleep 1; done

#!/bin/sh
# Stands in for a real coding agent under examples/claude-code/entrypoint.sh: reads the prompt
# on standard input, edits a file in the checkout, and prints its summary.
grep -q "## How to work" || { echo "no prompt on standard input"; exit 1; }
echo "verbose: true" > VERBOSE.md
echo "Added \`VERBOSE.md\` so each step is printed."

#!/bin/sh
# A stand-in for a real agent: what `--agent-cmd` runs for each agent task.
# It reads the prompt from the file named by CRUCIBLE_PROMPT_FILE (the prompt is
# never an argument), writes a reply, and reports what it was given. A real
# harness would send the prompt to a model here.
#
# Its result object: `reply` (string), `prompt_bytes` (integer) and
# `saw_params` (boolean). Every example agent task declares `reply`; the other
# two are declared by examples/agent (whose evaluate task checks them) and
# travel as undeclared fields elsewhere. It works under both IR versions:
# edition 3 hands inputs as files in CRUCIBLE_INPUTS_DIR, editions 1-2 as one
# object in CRUCIBLE_INPUTS_FILE.
set -eu
prompt_bytes=$(wc -c < "$CRUCIBLE_PROMPT_FILE" | tr -d ' ')
saw_params=false
topic=""
if [ -n "${CRUCIBLE_INPUTS_DIR:-}" ]; then
    if [ -e "$CRUCIBLE_INPUTS_DIR/params" ]; then
        saw_params=true
    fi
    if [ -e "$CRUCIBLE_INPUTS_DIR/topic" ]; then
        topic=$(tr -d '"\\' < "$CRUCIBLE_INPUTS_DIR/topic")
    fi
elif [ -n "${CRUCIBLE_INPUTS_FILE:-}" ] && grep -q '"params":' "$CRUCIBLE_INPUTS_FILE"; then
    saw_params=true
fi
if [ -n "$topic" ]; then
    reply="Light turns on the rock; / $topic waits for the night; / the sea keeps its time."
else
    reply="stand-in reply to a prompt of $prompt_bytes bytes."
fi
echo "stand-in: ${CRUCIBLE_TASK} attempt ${CRUCIBLE_ATTEMPT}, prompt of $prompt_bytes bytes" >&2
printf '{"reply": "%s", "prompt_bytes": %s, "saw_params": %s}\n' \
    "$reply" "$prompt_bytes" "$saw_params" > "$CRUCIBLE_OUTPUT"

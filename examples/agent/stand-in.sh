#!/bin/sh
# A stand-in for a real agent: what `--agent-cmd` runs for each agent task.
# It reads the prompt from the file named by CRUCIBLE_PROMPT_FILE (the prompt is
# never an argument), writes a reply, and reports what it was given. A real
# harness would send the prompt to a model here.
set -eu
prompt_bytes=$(wc -c < "$CRUCIBLE_PROMPT_FILE" | tr -d ' ')
saw_params=false
if [ -n "${CRUCIBLE_INPUTS_DIR:-}" ] && [ -e "$CRUCIBLE_INPUTS_DIR/params" ]; then
    saw_params=true
fi
topic=$(cat "$CRUCIBLE_INPUTS_DIR/topic" 2>/dev/null | tr -d '"\\' || true)
echo "stand-in: prompt of $prompt_bytes bytes (attempt ${CRUCIBLE_ATTEMPT})" >&2
printf '{"reply": "Light turns on the rock; / %s waits for the night; / the sea keeps its time.", "prompt_bytes": %s, "saw_params": %s}\n' \
    "$topic" "$prompt_bytes" "$saw_params" > "$CRUCIBLE_OUTPUT"

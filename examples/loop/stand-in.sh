#!/bin/sh
# The loop body's stand-in agent (examples/loop and examples/loop-patience).
#
# It reads what the dispatcher stages before each revision (docs/spec/loop.md):
#   $CRUCIBLE_INPUTS_DIR/revision  the revision number, from 1
#   $CRUCIBLE_INPUTS_DIR/history   earlier revisions, newest last
#   $CRUCIBLE_INPUTS_DIR/kept      null, or the kept revision with its outputs
#   $CRUCIBLE_INPUTS_DIR/step      its declared input (setup.step)
# and proposes the kept guess plus step (1 when nothing is kept). An absent file
# reads as revision 1 with nothing kept, so the pack also runs as a plain DAG.
#
# Its result: `guess` (number) and `seen` (how many history records it was
# given). POSIX sh, sed, tr and awk only: the values are canonical JSON.
set -eu
d=$CRUCIBLE_INPUTS_DIR
revision=1
if [ -e "$d/revision" ]; then
    revision=$(tr -d ' \n\t\r' < "$d/revision")
fi
seen=0
if [ -e "$d/history" ]; then
    seen=$(tr ',{' '\n\n' < "$d/history" | grep -c '"revision":' || true)
fi
kept=""
if [ -e "$d/kept" ]; then
    # the kept revision's outputs: {"outputs":{"propose":{"guess":G,...},...},...}
    kept=$(tr -d ' \n\t\r' < "$d/kept" | sed -n 's/.*"guess":\([-+.0-9eE]*\).*/\1/p')
fi
step=$(cat "$d/step")
if [ -n "$kept" ]; then
    guess=$(awk -v k="$kept" -v s="$step" 'BEGIN { printf "%.10g", k + s }')
else
    guess=1
fi
echo "stand-in: revision $revision, $seen earlier, kept guess ${kept:-none}: proposing $guess" >&2
printf '{"guess": %s, "seen": %s}\n' "$guess" "$seen" > "$CRUCIBLE_OUTPUT"

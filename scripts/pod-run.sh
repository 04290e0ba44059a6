#!/usr/bin/env bash
# Start one command detached on this host, so it outlives the SSH session that started it:
#   scripts/pod-run.sh RUN COMMAND...     (docs/tpu-runbook.md, step 7)
# It runs in the tmux session "train" (POD_SESSION names another; under nohup + setsid where
# tmux is missing) and appends stdout and stderr to logs/RUN-<hostname>.log: each attempt
# starts with a line "=== attempt <UTC time> on <hostname>: COMMAND" and, once it ends, adds
# "exit code N", so resuming under the same run name keeps the earlier attempts' causes and
# codes (scripts/pod-status.sh reads the last attempt). Pass environment variables inside
# COMMAND (env PJRT_DEVICE=TPU ...): a tmux server that is already running would not see this
# shell's.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 RUN COMMAND..." >&2
  exit 2
fi
run=$1
shift
session=${POD_SESSION:-train}
mkdir -p logs
log="logs/$run-$(hostname).log"
if command -v tmux > /dev/null && tmux has-session -t "$session" 2> /dev/null; then
  echo "$0: a tmux session '$session' is already running on $(hostname): stop it first" >&2
  exit 2
fi
printf '=== attempt %s on %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(hostname)" "$*" >> "$log"
body="$(printf '%q ' "$@") >> $(printf '%q' "$log") 2>&1; echo \"exit code \$?\" >> $(printf '%q' "$log")"
if command -v tmux > /dev/null; then
  tmux new-session -d -s "$session" "bash -c $(printf '%q' "$body")"
else
  nohup setsid bash -c "$body" < /dev/null > /dev/null 2>&1 &
fi
echo "started on $(hostname): $log"

#!/usr/bin/env bash
# Start one command detached on this host, so it outlives the SSH session that started it:
#   scripts/pod-run.sh RUN COMMAND...     (docs/tpu-runbook.md, step 7)
# It runs in the tmux session "train" (or under nohup + setsid where tmux is missing), writes
# stdout and stderr to logs/RUN-<hostname>.log and, once it ends, "exit code N" as that log's
# last line. Pass environment variables inside COMMAND (env PJRT_DEVICE=TPU ...): a tmux server
# that is already running would not see this shell's.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 RUN COMMAND..." >&2
  exit 2
fi
run=$1
shift
mkdir -p logs
log="logs/$run-$(hostname).log"
body="$(printf '%q ' "$@") > $(printf '%q' "$log") 2>&1; echo \"exit code \$?\" >> $(printf '%q' "$log")"
if command -v tmux > /dev/null; then
  if tmux has-session -t train 2> /dev/null; then
    echo "$0: a tmux session 'train' is already running on $(hostname): stop it first" >&2
    exit 2
  fi
  tmux new-session -d -s train "bash -c $(printf '%q' "$body")"
else
  nohup setsid bash -c "$body" < /dev/null > /dev/null 2>&1 &
fi
echo "started on $(hostname): $log"

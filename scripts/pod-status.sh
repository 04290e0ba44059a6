#!/usr/bin/env bash
# One line about this host's last attempt of a run started by scripts/pod-run.sh:
#   scripts/pod-status.sh RUN    ->  <hostname> | host 1 | train step 1200 | exit code 130
# (docs/tpu-runbook.md, steps 8 and 9): the last step line the host logged (every host logs
# its own, tagged "host N"), and "exit code N" once the attempt has ended ("running" before).
# Run on every worker: each host must show a step line; once the pod has stopped, every host
# must show the same step and the same exit code.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 RUN" >&2
  exit 2
fi
log="logs/$1-$(hostname).log"
if [ ! -f "$log" ]; then
  echo "$(hostname) | no log $log"
  exit 1
fi
# The last attempt: the lines after its "=== attempt" header.
attempt=$(awk '/^=== attempt /{n = 0} {lines[n++] = $0} END{for (i = 0; i < n; i++) print lines[i]}' "$log")
step=$(grep -oE 'host [0-9]+ \| train step [0-9]+' <<< "$attempt" | tail -n 1 || true)
ended=$(grep -E '^exit code [0-9]+$' <<< "$attempt" | tail -n 1 || true)
echo "$(hostname) | ${step:-no step line} | ${ended:-running}"
[ -n "$step" ]

#!/bin/sh
# The entrypoint of the runtime-vllm-cpu image (vLLM's CPU build): it stands in for the one of AWS's vLLM Neuron
# Deep Learning Containers, ENTRYPOINT ["python", "/usr/local/bin/vllm_entrypoint.py"], whose body runs its
# arguments (sys.argv[1:]) as the command. The operator's engine vllm pods pass the whole command line as the
# container's args and no command: ["vllm", "serve", "/models/model", "--port", "8000", ...].
# `exec`: the command replaces this shell as PID 1 of the container, so the kubelet's SIGTERM reaches vLLM itself
# (which drains and exits) instead of a shell that would not forward it. POSIX sh: the base's /bin/sh is dash.
set -eu
if [ "$#" -eq 0 ]; then
  echo "usage: <command> [args...], e.g. vllm serve /models/model --port 8000 (the container's args)" >&2
  exit 2
fi
exec "$@"

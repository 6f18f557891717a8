# The ENTRYPOINT of the runtime-vllm-cpu image, standing in for the one of AWS's vLLM Neuron Deep Learning
# Containers exactly as it behaves there (DLC common/vllm_entrypoint.py, the image's
# ENTRYPOINT ["python", "/usr/local/bin/vllm_entrypoint.py"]): it runs its arguments as a child process and waits.
# As PID 1 of a container it installs no SIGTERM handler, so the kernel drops the kubelet's SIGTERM and the child
# never sees it: a pod that passes `vllm serve ...` as args would never drain. The operator puts `vllm serve` in the
# container's command, which bypasses this file; the image keeps the DLC's behaviour to catch a pod that does not.
import subprocess
import sys

subprocess.check_call(sys.argv[1:])

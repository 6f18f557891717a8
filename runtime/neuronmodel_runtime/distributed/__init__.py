"""Multi-process tensor parallelism: the group, the step broadcast from the leader, the workers."""

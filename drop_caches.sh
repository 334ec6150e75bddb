#!/usr/bin/env bash
# Drops this node's page cache, as MLPerf asks before each run. Exit status 0 only when the cache
# was really dropped: the caller then sets CACHE_CLEAR=1, which the trainer logs as cache_clear.
# Needs root or passwordless sudo for sysctl. Prints nothing; the caller says what a failure means.
# Used by run.sub (on every node, through srun), run_with_docker.sh and run_and_time.sh.
sync && { sysctl -q vm.drop_caches=3 || sudo -n /sbin/sysctl -q vm.drop_caches=3; } >/dev/null 2>&1

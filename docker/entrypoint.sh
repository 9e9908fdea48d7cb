#!/bin/bash
# The image's PID 1: runs its command (tritonserver, the CMD) as a child, passes SIGTERM and SIGINT on
# to it, reaps orphans, and exits with the child's status.
#
# Why not exec tritonserver as PID 1: the init of a PID namespace receives from inside the namespace
# only the signals it handles (pid_namespaces(7)), so SIGKILL from the exit watchdog
# (adaserve_backend/triton/exit_watchdog.py), which bounds a stop whose gRPC clients hold their streams
# open, would be dropped, and `docker stop` would wait out its own 10 s before killing. Here the
# watchdog's kill lands, and the container ends within the drain's grace and the watchdog's margin.
set -u
"$@" &
child=$!
forward() { kill -s "$1" "$child" 2>/dev/null; }
trap 'forward TERM' TERM
trap 'forward INT' INT
# `wait` returns early when a trapped signal arrives: wait again until the child itself has ended.
while true; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || exit "$status"
done

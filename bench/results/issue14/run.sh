#!/bin/bash
# Issue 14: make bench (quick) on the tree before the house (9a83aa6, with main's bench/) and on main, interleaved.
for i in 1 2; do
  for side in before main; do
    if [ $side = before ]; then dir=/work/wt/before; else dir=/work/main; fi
    echo "== $side $i $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $dir && .venv/bin/python -m bench.run --quick --no-peer --no-plots --out /work/results/b14/$side-$i > /work/results/b14/$side-$i.log 2>&1; echo "rc $?")
  done
done
echo ALLDONE $(date +%T)

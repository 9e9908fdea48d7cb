"""A serving simulator at GPU scale that drives the project's real scheduler and token-tree selection
on a virtual clock (issue 17). `python -m sim --help`.

  clock.py        virtual clock and event queue (deterministic order)
  hardware.py     GPU and model shapes from published numbers (and the H100's measured peaks)
  gpu_cost.py     first-principles TP forward latency, calibrated to published and measured points
  gpu_measured.py a `make gpu-check` run's layer timings and the H100 efficiency fitted to them
  cost.py         iteration duration (CPU profile or GPU model) and the profile the scheduler sees
  acceptance.py   per-depth acceptance models (presets, the engine's table)
  drafts.py       synthetic candidate trees and their verification (copies walked on true tokens)
  continuations.py the served target's greedy output per prompt (validate: the copies' truth)
  replica.py      one engine: real Scheduler + Estimator + choose_trees, simulated model runner
  router.py       round robin, least loaded, SLO-aware routing over replicas (the Ray Serve router's rank)
  router_check.py the simulated routers replayed on a real deployment's recorded routing decisions
  workload.py     requests from harness/workload.py generators with the paper's SLOs
  scenario.py     a deployment from names (cpu, a100x4 + llama70b, ...)
  simulator.py    the discrete-event loop and scoring (harness/metrics.py)
  runs.py         a batch of runs behind one progress bar, one result row each
  options.py      the commands' shared options and their defaults
  report.py       JSON output and tables; plots.py: the PNGs
  cli.py          sweeps (`python -m sim`)
  paper.py        the paper's Figures 7-8 and its two sweeps, with ratios over the best baseline
  scaleout.py     replicas needed per load and router
  validate.py     predicted vs measured for a `make bench` result
  checks.py       one run against a fixed bar; bands.py: repeated runs' band and leave-one-out errors
  calibration.py  what validate prices a measured run with: step fit, machine speed, scaled acceptance
"""

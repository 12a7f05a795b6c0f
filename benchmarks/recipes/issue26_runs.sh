#!/usr/bin/env bash
# Issue 26's timed must-shows, one after another on a quiet machine (nothing else running: check `uptime`).
# Each run is recorded by scripts/record.sh under benchmarks/results/cpu-2core/issue26/ with its load.
#
#   bash benchmarks/recipes/issue26_runs.sh compares     # nanoGPT 3-way, gpt2-tiny A/A and eager vs module, 3 runs each
#   bash benchmarks/recipes/issue26_runs.sh studies      # the nanoGPT 8-trial study, seeds 0 and 1
#   bash benchmarks/recipes/issue26_runs.sh table        # benchmarks/tables/nanogpt-cpu.csv for scripts/replay_search.py
#   bash benchmarks/recipes/issue26_runs.sh script       # issue 29: nanoGPT's own train.py tuned as it is
#   bash benchmarks/recipes/issue26_runs.sh probe        # why a process changes speed (benchmarks/recipes/speed_change_probe.py)
#   bash benchmarks/recipes/issue26_runs.sh compares7    # the gpt2-tiny pair and A/A again with compare.processes=7
#   bash benchmarks/recipes/issue26_runs.sh staged       # issue 16's staged study, seeds 0, 1, 2, under the new rules
#   bash benchmarks/recipes/issue26_runs.sh default7     # the compares (nanoGPT, gpt2-tiny eager vs module) and the staged
#                                             # seeds again at the defaults of 7 processes and the measured alone check
set -euo pipefail
cd "$(dirname "$0")/../.."
out=benchmarks/results/cpu-2core/issue26
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nanogpt=(+model=custom model._target_=examples.models.nanogpt.tiny workload.batch_size=8 'workload.seq_len=[128]')
common=(tracking.enabled=false)

for part in "$@"; do
  case $part in
    compares)
      for run in 1 2 3; do
        bash scripts/record.sh "$out/compare_nanogpt_run$run.txt" python -m autocompile "${nanogpt[@]}" task=compare \
          'compare.candidates=["compile.scope=none","compile.scope=regional","compile.scope=train_step"]' \
          "${common[@]}" "output_root=$work/ng$run"
        bash scripts/record.sh "$out/compare_aa_gpt2-tiny_run$run.txt" python -m autocompile +model=gpt2-tiny \
          task=compare 'compare.candidates=["compile.scope=module","compile.scope=module"]' "${common[@]}" \
          "output_root=$work/aa$run"
        bash scripts/record.sh "$out/compare_eager_vs_module_gpt2-tiny_run$run.txt" python -m autocompile \
          +model=gpt2-tiny task=compare 'compare.candidates=["compile.scope=none","compile.scope=module"]' \
          "${common[@]}" "output_root=$work/em$run"
      done ;;
    compares7)  # 7 processes instead of 5: the machine's speed changes make processes disagree (probe)
      for run in 1 2 3; do
        bash scripts/record.sh "$out/compare7_aa_gpt2-tiny_run$run.txt" python -m autocompile +model=gpt2-tiny \
          task=compare 'compare.candidates=["compile.scope=module","compile.scope=module"]' compare.processes=7 \
          "${common[@]}" "output_root=$work/aa7$run"
        bash scripts/record.sh "$out/compare7_eager_vs_module_gpt2-tiny_run$run.txt" python -m autocompile \
          +model=gpt2-tiny task=compare 'compare.candidates=["compile.scope=none","compile.scope=module"]' \
          compare.processes=7 "${common[@]}" "output_root=$work/em7$run"
      done ;;
    staged)  # issue 16's command as it ran then (MLflow on), for the wall time before and after
      for seed in 0 1 2; do
        bash scripts/record.sh "$out/study_gpt2-tiny_staged_seed$seed.txt" python -m autocompile +model=gpt2-tiny \
          study.n_trials=8 study.confirm_top=2 study.repeats=3 "study.seed=$seed" \
          "output_root=$work/staged$seed"
      done ;;
    studies)
      for seed in 0 1; do
        bash scripts/record.sh "$out/study_nanogpt_seed$seed.txt" python -m autocompile "${nanogpt[@]}" \
          study.n_trials=8 "study.seed=$seed" study.confirm_top=2 'study.verdicts=[compile.scope,amp.dtype]' \
          "${common[@]}" "output_root=$work/study$seed"
      done ;;
    table)  # the second table: nanoGPT, whose best program is compiled; 40 configurations (ac and compiled
            # autograd fixed off to keep it near 20 minutes)
      bash scripts/record.sh "$out/program_table_nanogpt.txt" python scripts/program_table.py --model custom \
        --name nanogpt --override=model._target_=examples.models.nanogpt.tiny --override=workload.batch_size=8 \
        '--override=workload.seq_len=[128]' --override=ac.policy=none --override=compile.compiled_autograd=false \
        --output-root "$work/table" ;;
    script)  # issue 29: karpathy/nanoGPT's own train.py, unchanged, tuned as a script (examples/nanogpt/README.md)
      (cd examples/nanogpt && python make_data.py > /dev/null)
      root=$PWD
      args="config/train_shakespeare_char.py --device=cpu --dtype=float32 --batch_size=8 --block_size=128"
      args+=" --n_layer=2 --n_head=2 --n_embd=64 --max_iters=5000 --eval_interval=100000 --eval_iters=2"
      args+=" --log_interval=100000 --dropout=0.0"
      (cd examples/nanogpt && bash "$root/scripts/record.sh" "$root/$out/study_nanogpt_train_py.txt" python -m autocompile \
        script.path=train.py "script.args=\"$args\"" study.n_trials=6 'study.verdicts=[compile.scope]' \
        "${common[@]}" "output_root=$work/script") ;;
    probe)  # why a process changes speed: the steps beside a control loop that shares nothing with them
      for threads in 2 1; do
        bash scripts/record.sh "$out/speed_change_probe_threads$threads.txt" python benchmarks/recipes/speed_change_probe.py \
          --threads "$threads" --windows 120
      done ;;
    default7)  # compare.processes defaults to 7 and the alone check takes the processes' own spread
      for run in 1 2 3; do
        bash scripts/record.sh "$out/default7_compare_nanogpt_run$run.txt" python -m autocompile "${nanogpt[@]}" \
          task=compare 'compare.candidates=["compile.scope=none","compile.scope=regional","compile.scope=train_step"]' \
          "${common[@]}" "output_root=$work/d7ng$run"
        bash scripts/record.sh "$out/default7_compare_eager_vs_module_gpt2-tiny_run$run.txt" python -m autocompile \
          +model=gpt2-tiny task=compare 'compare.candidates=["compile.scope=none","compile.scope=module"]' \
          "${common[@]}" "output_root=$work/d7em$run"
      done ;;
    default7-staged)
      for seed in ${SEEDS:-0 1 2}; do
        bash scripts/record.sh "$out/default7_study_gpt2-tiny_staged_seed$seed.txt" python -m autocompile \
          +model=gpt2-tiny study.n_trials=8 study.confirm_top=2 study.repeats=3 "study.seed=$seed" \
          "output_root=$work/d7staged$seed"
      done ;;
    *) echo "unknown part $part (compares, compares7, staged, studies, table, script, probe, default7, default7-staged)" >&2
       exit 2 ;;
  esac
done

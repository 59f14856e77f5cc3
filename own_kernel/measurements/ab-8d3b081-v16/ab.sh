#!/bin/bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
ROOT=$PWD
run() { # $1 = tree, $2 = out
  cd $1
  export PYTHONPATH=/tmp/site:$PWD
  B="python -m suite bench --preset grid --providers own,own_filter --reps 5 --warmup 2 --phases loss+grad --quiet --dtype bf16"
  timeout 100 $B --dist lm --n 2048 --d 2304 --v 50257 --out $2
  timeout 100 $B --dist lm --n 8192 --d 2304 --v 32000,50257 --out $2 --resume
  timeout 100 $B --dist uniform --n 2048,8192 --d 2304 --v 256000 --out $2 --resume
  timeout 100 $B --dist lm --n 8192 --d 4096 --v 256000 --out $2 --resume
  cd $ROOT
}
export CCE_BENCH_COMMIT=$(cat .commit)
run $ROOT/old_ab /tmp/ab-old
export CCE_BENCH_COMMIT=$(cat .commit)+v16
run $ROOT /tmp/ab-new
export CCE_BENCH_COMMIT=$(cat .commit)+v16-col_round CCE_OWN_CONFIG='{"col_round": true}'
run $ROOT /tmp/ab-colround
unset CCE_OWN_CONFIG
cd /tmp && tar czf $OUT/ab.tgz ab-old ab-new ab-colround
cd $ROOT && PYTHONPATH=/tmp/site:$PWD python - <<'PY'
import pandas as pd
rows=[]
for tag in ("old","new","colround"):
    df=pd.read_csv(f"/tmp/ab-{tag}/results.csv"); df=df[df.phase=="loss+grad"]
    df["ver"]=tag; rows.append(df)
df=pd.concat(rows)
pd.set_option("display.width", 250)
print(df.pivot_table(index=["dist","n","d","v"],columns=["provider","ver"],values="ms").round(2).to_string())
print(df.pivot_table(index=["dist","n","d","v"],columns=["provider","ver"],values="dc_rel_err").round(5).to_string())
print(df.pivot_table(index=["dist","n","d","v"],columns=["provider","ver"],values="de_rel_err").round(5).to_string())
PY

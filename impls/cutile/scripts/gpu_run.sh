# run 8 shards in parallel, then summarize
mkdir -p $OUT
for i in 0 1 2 3 4 5 6 7; do
  CUTILE_TEST_SHARD=$i/8 timeout 540 python -m pytest tests/gpu/test_cutile.py -q -x -rfE -s -p no:cacheprovider > $OUT/shard$i.log 2>&1 &
done
wait
grep -h "^\[cutile\]" $OUT/shard*.log | sort > $OUT/summary.txt
tail -n 3 $OUT/shard*.log
grep -h -A30 "^FAILED\|Error\|error" $OUT/shard*.log | head -80
wc -l $OUT/summary.txt

exec(open(__file__.rsplit("/", 1)[0] + "/spin.py").read().split("S = {")[0])
def sess2(**cfg):
    so = ort.SessionOptions(); so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    for k, v in cfg.items(): so.add_session_config_entry(k, v)
    s = ort.InferenceSession(gbytes, so, providers=["CPUExecutionProvider"])
    return lambda: s.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
S = {"stop": sess2(**{"session.force_spinning_stop": "1"}), "nostop": sess2(),
     "spin1ms": sess2(**{"session.intra_op.spin_duration_us": "1000"}),
     "spin200us": sess2(**{"session.intra_op.spin_duration_us": "200"}),
     "spin1ms_b8": sess2(**{"session.intra_op.spin_duration_us": "1000", "session.intra_op.spin_backoff_max": "8"})}
for s in S:
    S[s](); S[s]()
    c0 = time.process_time(); time.sleep(0.5); print(s, "cpu s in 0.5 s after a run: %.3f" % (time.process_time() - c0))

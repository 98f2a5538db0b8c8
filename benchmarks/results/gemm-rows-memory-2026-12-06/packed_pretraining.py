import torch, random, sys, time
# run from the repository root with bertkit installed
from bertkit.config import BertConfig
from bertkit.model import BertForPreTraining
from bertkit.packing import pack
from bertkit.train.model import forward
torch.set_num_threads(2); torch.manual_seed(0)
cfg = BertConfig(vocab_size=8000, hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024,
                 hidden_dropout=0.0, attention_dropout=0.0, norm_position="pre", position_embedding_type="alibi")
model = BertForPreTraining(cfg, nsp=False)
opt = torch.optim.AdamW(model.parameters(), 1e-4)
rng = random.Random(0)
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20
t0 = time.time()
for i in range(int(sys.argv[1])):
    lens = [rng.randint(20, 128) for _ in range(32)]
    mask = torch.zeros(32, 128, dtype=torch.long)
    for b, n in enumerate(lens): mask[b, :n] = 1
    ids = torch.randint(5, 8000, (32, 128))
    labels = torch.where(torch.rand(32, 128) < 0.15, ids, torch.full_like(ids, -100))
    labels[0, 0] = ids[0, 0]
    with torch.autocast("cpu", torch.bfloat16):
        out = forward(model, {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
                              "mlm_labels": labels}, packed=True)
    out["loss"].backward(); opt.step(); opt.zero_grad()
    if i % 50 == 0: print(i, rss(), "MB", round(time.time() - t0), "s", flush=True)

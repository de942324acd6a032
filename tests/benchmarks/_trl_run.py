"""What the TRL benchmark scripts' child processes share (``bench_trl.py``, ``bench_trainer_vs_trl.py``): the
dataset of the bundled GSM8K sample in the trainer's prompt template, the tiny model, the lenient reward, and a
callback that records each step's wall time and CPU time (``time.process_time``: all threads of the process; with
``OMP_NUM_THREADS=1`` it equals the wall time on an idle machine, and it leaves out the waits for a core that a
shared machine adds). Pasted into each child script after its argument parsing, which
defines ``model_dir``, ``data``, ``steps`` and ``prompts``."""

SETUP = r"""
recs = [json.loads(l) for l in open(data)][: prompts * steps]
ds = Dataset.from_list([{"prompt": [{"role": "user", "content": DEFAULT_PROMPT_TEMPLATE.format(problem=r["problem"])}],
                         "answer": r["answer"]} for r in recs])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

def reward(completions, answer, **kw):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return gsm8k_lenient_reward(texts, answer)

times, cpu_times = [], []
class T(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw): self.t, self.c = time.perf_counter(), time.process_time()
    def on_step_end(self, args, state, control, **kw):
        times.append(time.perf_counter() - self.t)
        cpu_times.append(time.process_time() - self.c)
"""

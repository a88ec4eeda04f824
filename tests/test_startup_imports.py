"""Start-up cost: the sweep driver's imports (the trial module it hands to Tune included) and
Tune's TensorBoard logger load no torch; the functions a compiled block must run eager are
excluded from compiling as ``moe_core.moe.layer`` is imported (deferring it made 2-rank gloo
expert-parallel processes abort at exit), and stay so once compiling is turned on."""

import subprocess
import sys

CODE = """
import sys
import sweeps.run.driver, sweeps.run.trial, sweeps.run.parents
sweeps.run.driver.tensorboard_without_torch()  # then Tune's default TensorBoard logger
from ray.tune.logger import TBXLoggerCallback
TBXLoggerCallback()
print(sorted(m for m in ('torch', 'deepspeed', 'transformers') if m in sys.modules))
import moe_core.moe.layer as L
from moe_core.config import MoEConfig
from moe_core.model import Transformer
from moe_core.presets import model_config
m = Transformer(model_config('debug', vocab_size=32, moe=MoEConfig(num_experts=2, top_k=1)))
eager = [L.swiglu_experts_loop, L.liger_experts, L._swiglu_experts_grouped_eager,
         L.MoELayer._record_stats]
print('torch._dynamo' in sys.modules, [getattr(f, '_torchdynamo_disable', False) for f in eager])
m.enable_speedups(compile=True, backend='eager')
eager = [L.swiglu_experts_loop, L.liger_experts, L._swiglu_experts_grouped_eager,
         L.MoELayer._record_stats]
print([getattr(f, '_torchdynamo_disable', False) for f in eager])
"""


def test_driver_imports_no_torch_and_compile_exclusions_come_with_the_layer():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "[]", f"the sweep driver's imports loaded {out[0]}"
    assert out[1] == "True [True, True, True, True]", out[1]
    assert out[2] == "[True, True, True, True]", out[2]

"""What V4Synthetic says its written checkpoint holds (a fixture copies it only under a limit):
no less than the tensor bytes `synth` writes, and no more than a fifth above them (float
tensors are counted as F32, most are BF16)."""

from __future__ import annotations

from stepper.families.deepseek_v4_synth import V4Synthetic, synth_v4_checkpoint
from stepper.session import preset_config as v4_preset
from stepper.weights.safetensors_reader import SafetensorsFile


def test_stored_bytes_bounds_what_synth_writes(tmp_path):
    source = V4Synthetic(v4_preset("tiny-v4"), seed=0)
    folder = synth_v4_checkpoint(source.config, tmp_path / "ck", seed=0)
    written = 0
    for shard in sorted(folder.glob("*.safetensors")):
        with SafetensorsFile(shard) as f:
            written += sum(f.info(name).nbytes for name in f.names())
    assert written <= source.stored_bytes() <= 1.2 * written, (written, source.stored_bytes())

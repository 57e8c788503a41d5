"""CNHubert's feature extractor runs layer by layer: the first conv's long activations (one float32 frame of
``conv_dim[0]`` values per 5 input samples) are freed before the next layer's temporaries exist, so a reference
clip's forward holds a few of them at a time, not the whole stack's (the peak RSS of loading a voice)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from dora_primespeech_mlx.models.hubert.model import HubertArgs, HubertModel


def test_feature_extractor_peak_is_a_few_first_layer_activations():
    args = HubertArgs(num_hidden_layers=1)
    model = HubertModel(args)
    mx.eval(model.parameters())
    wav = mx.array(np.random.default_rng(0).standard_normal((1, 16000 * 5)).astype(np.float32) * 0.1)
    first = (wav.shape[1] - args.conv_kernel[0]) // args.conv_stride[0] + 1  # frames after the first conv
    first_bytes = first * args.conv_dim[0] * 4
    mx.clear_cache()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    out = model.feature_extractor(wav)
    mx.eval(out)
    extra = mx.get_peak_memory() - base
    # the whole lazy stack at once held ~21 first-layer activations; layer by layer ~11
    assert extra < 15 * first_bytes, (extra / first_bytes)

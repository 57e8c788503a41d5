"""The SoVITS synthesizer: its math (``model``: text encoder, flow, quantizer; ``layers``; the HiFi-GAN generator
``hifigan``; the CPU-friendly convolutions ``conv``) and the vocoder backends that run the generator (``vocoder``
chooses one: MLX, ONNX Runtime ``vocoder_onnx``, OpenVINO ``vocoder_openvino``, cut into parts
``vocoder_split``)."""

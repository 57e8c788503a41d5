"""Chinese RoBERTa, the text's phone-level features: MLX (``model``) and numpy with the float16 kernels
(``numpy_encoder``), chosen by the model when it loads."""

"""Entry points the conformance sweep names as a user would (``bench/zoo_factories.py:torchvision_model``): models
of torchvision, diffusers and ultralytics, built small with random weights, nothing downloaded."""
from __future__ import annotations

import inspect
import os

from torch import nn

# ultralytics checks for updates and writes settings on import: keep it offline and quiet
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_VERBOSE", "False")


def torchvision_model(name: str, batchnorm_statistics_size: int | None = None, **kwargs) -> nn.Module:
    """``torchvision.models.get_model(name)`` with random weights (no download), weight matrices left at zero by
    the init given a random one (:func:`revive_degenerate_weights`: torchvision's ViT zero-initialises its head).

    ``batchnorm_statistics_size``: set every BatchNorm's running statistics on random images of that size (the
    sweep's own input distribution), as training leaves them; for a network whose random init lets the
    activations vanish with depth (see the catalogue), which no trained model does."""
    import torchvision

    kwargs.setdefault("weights", None)
    # the builders are wrapped (legacy-argument handling): their own signature is behind __wrapped__, and a
    # detection or segmentation builder left with its default weights_backbone downloads ImageNet weights
    if "weights_backbone" in inspect.signature(torchvision.models.get_model_builder(name)).parameters:
        kwargs.setdefault("weights_backbone", None)
    model = torchvision.models.get_model(name, **kwargs)
    revive_degenerate_weights(model)
    if batchnorm_statistics_size:
        # a detector in training mode wants targets: only its BatchNorms are put in training mode
        detector = name in torchvision.models.list_models(module=torchvision.models.detection)
        set_batchnorm_statistics(model, batchnorm_statistics_size, norms_only=detector)
    return model.eval()


def revive_degenerate_weights(model: nn.Module) -> list[str]:
    """Give weight matrices that a library's init leaves at about zero (transformers' SAM: |w| < 1e-9; the zero
    heads of torchvision's ViT and of timm's MLP-Mixer, Sequencer and Hiera) a random normal init (std
    1/sqrt(fan-in)); the names of those changed.

    A trained model never has them, and on them every quantizer's amax collapses (<= 2**-24) and the output is
    constant (a zero head returns its bias whatever the input): the sweep's SQNR and parity would say nothing
    about the architecture."""
    import torch

    changed = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2 and parameter.is_floating_point() and float(parameter.abs().max()) < 1e-6:
                fan_in = max(parameter[0].numel(), 1)
                parameter.normal_(0.0, fan_in ** -0.5)
                changed.append(name)
    return changed


def set_batchnorm_statistics(model: nn.Module, size: int, batches: int = 4, key: str | None = None,
                             norms_only: bool = False) -> None:
    """Running mean and variance of every BatchNorm from ``batches`` forward passes on standard-normal images
    ``[8, 3, size, size]`` (a cumulative average, momentum None); the weights are not touched.

    ``key``: pass the images by that keyword (``pixel_values`` for a transformers model); ``norms_only``: only
    the BatchNorms run in training mode (a torchvision detector in training mode computes its losses and wants
    targets; its dropout-free layers are the same either way)."""
    import torch

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    generator = torch.Generator().manual_seed(1)
    if norms_only:
        model.eval()
        for norm in norms:
            norm.train()
    else:
        model.train()
    with torch.no_grad():
        for _ in range(batches):
            images = torch.randn(8, 3, size, size, generator=generator)
            model(**{key: images}) if key else model(images)
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum  # the module as built, but for its statistics
    model.eval()


def unet2d_condition() -> nn.Module:
    """diffusers' UNet2DConditionModel: cross-attention down and up blocks, a mid block, time embedding."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(32, 64),
                                layers_per_block=1, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=8, norm_num_groups=8).eval()


def autoencoder_kl() -> nn.Module:
    """diffusers' AutoencoderKL (the Stable Diffusion VAE's layout), decoding the posterior's mode."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(16, 32), latent_channels=4,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         norm_num_groups=8, sample_size=32).eval()


def dit_transformer() -> nn.Module:
    """diffusers' DiTTransformer2DModel: patchified latents, adaLN-zero blocks conditioned on timestep and class."""
    from diffusers import DiTTransformer2DModel

    return DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                 num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10,
                                 norm_num_groups=8).eval()


def sd3_transformer() -> nn.Module:
    """diffusers' SD3Transformer2DModel (MMDiT: joint attention over image and text tokens)."""
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                                 num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                                 pooled_projection_dim=16, out_channels=4, pos_embed_max_size=8).eval()


def yolo(config: str = "yolov8n.yaml") -> nn.Module:
    """An ultralytics model from its yaml (no weights), as ``YOLO("yolov8n.yaml").model`` builds it."""
    from ultralytics.nn.tasks import ClassificationModel, DetectionModel, PoseModel, SegmentationModel

    task = {"-seg": SegmentationModel, "-pose": PoseModel, "-cls": ClassificationModel}
    model_class = next((cls for suffix, cls in task.items() if config.removesuffix(".yaml").endswith(suffix)),
                       DetectionModel)
    model = model_class(config, nc=10 if model_class is not PoseModel else 1, verbose=False)
    return model.eval()


def main() -> None:
    """``python bench/zoo_factories.py FACTORY [key=value ...]``: build one model, print its size."""
    import sys

    factory = globals()[sys.argv[1]]
    model = factory(**dict(arg.split("=", 1) for arg in sys.argv[2:]))
    print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()

"""Tiny transformer (and residual CNN) architectures written the way real model code writes them.

timm cannot be imported on this machine, so its attention and block styles are written out here: a
ViT whose attention uses ``@`` (timm's ``Attention`` with ``fused_attn=False``), one calling
``F.scaled_dot_product_attention`` (``fused_attn=True``), ``nn.TransformerEncoder`` over token ids,
and ResNet BasicBlocks as torchvision and timm write them (``x += shortcut`` after rebinding ``x``).
Hugging Face models are built from tiny configs with random weights (no download).
bench/model_zoo.py uses the same builders.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    """timm's Attention: qkv Linear, reshape/permute, q @ k^T or SDPA, proj."""

    def __init__(self, dim: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.num_heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * 2)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(dim * 2, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, fused)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return x


class ViTLike(nn.Module):
    """Patch embedding (a convolution), class token, position embedding, blocks, head."""

    def __init__(self, dim: int = 32, depth: int = 2, heads: int = 4, fused: bool = False, image: int = 16,
                 patch: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        tokens = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, fused) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed
        x = self.blocks(x)
        return self.head(self.norm(x)[:, 0])


class TokenEncoder(nn.Module):
    """nn.TransformerEncoder over nn.Embedding token ids, mean-pooled into a classifier."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4, depth: int = 2, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(dim=1))


class TimmBasicBlock(nn.Module):
    """timm's BasicBlock: ``shortcut = x`` then ``x`` rebound, then ``x += shortcut``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.act1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.act2 = nn.ReLU(inplace=True)

    def forward(self, x):
        shortcut = x
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.act1(x)
        x = self.conv2(x)
        x = self.bn2(x)
        x += shortcut
        x = self.act2(x)
        return x


class TorchvisionBasicBlock(nn.Module):
    """torchvision's BasicBlock: ``identity = x``, ``out += identity``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNetStyle(nn.Module):
    def __init__(self, channels: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.layer1 = TimmBasicBlock(channels)
        self.layer2 = TorchvisionBasicBlock(channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(self.pool(x).flatten(1))


def hf_bert(attn: str = "eager"):
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, attn_implementation=attn)
    return BertModel(config, add_pooling_layer=False).eval()


def hf_vit(attn: str = "eager"):
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, attn_implementation=attn)
    return ViTModel(config, add_pooling_layer=False).eval()


def hf_llama(attn: str = "eager"):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         use_cache=False, attn_implementation=attn)
    return LlamaForCausalLM(config).eval()


def hf_gpt2(attn: str = "eager"):
    """GPT-2: its projections are transformers' Conv1D (a Linear with a transposed weight), its GELU the tanh
    formula written out."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                        eos_token_id=0, use_cache=False, attn_implementation=attn)
    return GPT2LMHeadModel(config).eval()


def hf_t5(attn: str = "eager"):
    """T5: an encoder-decoder taking input_ids, attention_mask and decoder_input_ids (lengths independent)."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                      decoder_start_token_id=0, use_cache=False, attn_implementation=attn)
    return T5ForConditionalGeneration(config).eval()


def hf_sam_vision(attn: str = "eager"):
    """HF SAM's vision encoder, 2 layers (one windowed, one global): its attention class is not fx-traceable."""
    from transformers import SamVisionConfig, SamVisionModel

    config = SamVisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                             patch_size=8, output_channels=16, window_size=2, global_attn_indexes=[1], mlp_dim=64,
                             num_pos_feats=8)
    return SamVisionModel._from_config(config, attn_implementation=attn).eval()


def hf_mamba():
    """HF Mamba (torch path: conv1d and dt_proj are used through their weights, the scan is a loop)."""
    from transformers import MambaConfig, MambaModel

    config = MambaConfig(vocab_size=64, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4,
                         time_step_rank=4, use_cache=False)
    return MambaModel(config).eval()


def hf_mixtral():
    """A Mixtral-style mixture-of-experts decoder (routing picks experts at run time)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                           use_cache=False)
    return MixtralForCausalLM(config).eval()


def diffusers_unet():
    """diffusers' UNet2DConditionModel, tiny: cross-attention down/up blocks, skip concatenations."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8, attention_head_dim=2, norm_num_groups=4).eval()


def unet_inputs(batch: int = 1, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"sample": torch.randn(batch, 4, 8, 8, generator=generator), "timestep": torch.tensor([3.0] * batch),
            "encoder_hidden_states": torch.randn(batch, 5, 8, generator=generator)}


def tokens(batch: int = 2, length: int = 8, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def images(batch: int = 2, size: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))

"""Deconvolution and Crop as FCN uses them: bilinear upsampling, crops back to the image, and bad settings."""

from __future__ import annotations

import numpy as np
import pytest
from test_cli import run

import netspec

UPSAMPLE = """
layers:
  - {{name: data, type: Input, top: [x, image], input_param: {{shape: [{{dim: [1, 2, 4, 4]}}, {{dim: [1, 2, 6, 6]}}]}}}}
  - {{name: up, type: Deconvolution, bottom: x, top: up, param: {{lr_mult: 0}},
     convolution_param: {{num_output: 2, group: 2, kernel_size: 4, stride: 2, bias_term: false,
                         weight_filler: {{type: bilinear}}}}}}
  - {{name: crop, type: Crop, bottom: [up, image], top: y, crop_param: {{offset: {offset}}}}}
"""


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["NumPy", "oneDNN where installed"])
def test_bilinear_deconvolution_upsamples_and_crop_cuts_back_to_the_image(dtype):
    net = netspec.load_net(UPSAMPLE.format(offset=1), dtype=dtype)
    assert net.blobs["up"].shape == (1, 2, 10, 10) and net.blobs["y"].shape == (1, 2, 6, 6)
    ramp = np.arange(4.0)
    net.blobs["x"].data[0, 0] = ramp[None, :] + 10  # a ramp along the width, and a constant
    net.blobs["x"].data[0, 1] = 3
    net.forward()
    y = net.blobs["y"].data[0]
    # away from the edges, bilinear upsampling by 2 keeps a constant and halves a ramp's slope
    np.testing.assert_allclose(y[1, 1:-1, 1:-1], 3, rtol=1e-6)
    np.testing.assert_allclose(np.diff(y[0, 2, 1:-1]), 0.5, rtol=1e-5)


def test_a_crop_outside_its_bottom_is_a_one_line_error(tmp_path):
    net = tmp_path / "fcn.yaml"
    net.write_text(UPSAMPLE.format(offset=5))
    result = run("check", net)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "fcn.yaml:" in result.stderr and "crop" in result.stderr
    assert "a crop of 6 at offset 5 does not fit in 10" in result.stderr


def test_a_deconvolution_whose_padding_eats_the_output_is_a_one_line_error(tmp_path):
    net = tmp_path / "deconv.yaml"
    net.write_text("layers:\n"
                   "  - {name: data, type: Input, top: x, input_param: {shape: {dim: [1, 1, 1, 1]}}}\n"
                   "  - {name: up, type: Deconvolution, bottom: x, top: y,\n"
                   "     convolution_param: {num_output: 1, kernel_size: 1, pad: 1}}\n")
    result = run("check", net)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "deconv.yaml:" in result.stderr and "'up'" in result.stderr and "padding" in result.stderr


def test_an_spp_whose_map_is_too_small_for_its_bins_is_a_one_line_error(tmp_path):
    net = tmp_path / "spp.yaml"
    net.write_text("layers:\n"
                   "  - {name: data, type: Input, top: x, input_param: {shape: {dim: [1, 2, 3, 3]}}}\n"
                   "  - {name: spp, type: SPP, bottom: x, top: y, spp_param: {pyramid_height: 3}}\n")
    result = run("check", net)
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert "spp.yaml:3: layer 'spp': spp_param.pyramid_height: a 3x3 map is too small for 4x4 bins at level 2" \
        in result.stderr

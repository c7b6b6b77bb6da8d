"""read_image_rgb on generated files with hand-known pixels, its errors, and parse_vocabulary."""
import numpy as np
import pytest
from PIL import Image

from sparseclip_d2.data.image_io import ImageReadError, VocabularyError, parse_vocabulary, read_image_rgb


def _check(out, shape):
    assert out.dtype == np.uint8 and out.shape == shape and out.flags["C_CONTIGUOUS"]


def test_rgb_png_round_trip(tmp_path):
    a = np.random.RandomState(0).randint(0, 256, (5, 7, 3), dtype=np.uint8)
    Image.fromarray(a).save(tmp_path / "x.png")
    out = read_image_rgb(str(tmp_path / "x.png"))
    _check(out, (5, 7, 3))
    assert np.array_equal(out, a)


def test_grayscale_replicated(tmp_path):
    g = np.array([[0, 17, 255], [128, 3, 200]], dtype=np.uint8)
    Image.fromarray(g, mode="L").save(tmp_path / "g.png")
    out = read_image_rgb(tmp_path / "g.png")
    _check(out, (2, 3, 3))
    for c in range(3):
        assert np.array_equal(out[:, :, c], g)


def test_one_bit(tmp_path):
    img = Image.new("1", (3, 1))
    img.putpixel((1, 0), 1)
    img.save(tmp_path / "b.png")
    out = read_image_rgb(tmp_path / "b.png")
    assert out[0, :, 0].tolist() == [0, 255, 0] and np.array_equal(out[..., 0], out[..., 2])


def test_rgba_alpha_dropped(tmp_path):
    a = np.array([[[10, 20, 30, 0], [200, 100, 50, 128], [1, 2, 3, 255]]], dtype=np.uint8)
    Image.fromarray(a, mode="RGBA").save(tmp_path / "a.png")
    out = read_image_rgb(tmp_path / "a.png")
    _check(out, (1, 3, 3))
    assert out.tolist() == [[[10, 20, 30], [200, 100, 50], [1, 2, 3]]]


def test_la_alpha_dropped(tmp_path):
    a = np.array([[[77, 0], [9, 255]]], dtype=np.uint8)
    Image.fromarray(a, mode="LA").save(tmp_path / "la.png")
    out = read_image_rgb(tmp_path / "la.png")
    assert out.tolist() == [[[77, 77, 77], [9, 9, 9]]]


def test_palette_and_palette_with_transparency(tmp_path):
    img = Image.new("P", (3, 1))
    img.putpalette([255, 0, 0, 0, 255, 0, 12, 34, 56] + [0] * (256 * 3 - 9))
    img.putdata([2, 0, 1])
    img.save(tmp_path / "p.png")
    out = read_image_rgb(tmp_path / "p.png")
    assert out.tolist() == [[[12, 34, 56], [255, 0, 0], [0, 255, 0]]]
    img.save(tmp_path / "pt.png", transparency=0)  # palette index 0 transparent: colour kept
    with Image.open(tmp_path / "pt.png") as check:
        assert check.mode == "P" and "transparency" in check.info
    assert read_image_rgb(tmp_path / "pt.png").tolist() == out.tolist()


def test_16bit_scaled_by_dtype_range_not_clipped(tmp_path):
    v = np.array([[0, 257, 65535], [257 * 100, 32768, 1000]], dtype=np.uint16)
    Image.fromarray(v).save(tmp_path / "d.png")
    with Image.open(tmp_path / "d.png") as check:
        assert check.mode.startswith("I")  # a 16-bit file, as PIL opens it
    out = read_image_rgb(tmp_path / "d.png")
    _check(out, (2, 3, 3))
    # round(v / 257): 32768 / 257 = 127.5019 -> 128; 1000 / 257 = 3.89 -> 4
    assert out[:, :, 0].tolist() == [[0, 1, 255], [100, 128, 4]]
    assert np.array_equal(out[:, :, 0], out[:, :, 1])


def test_16bit_big_endian_and_int32_and_float(tmp_path):
    from sparseclip_d2.data.image_io import to_rgb_array

    be = Image.frombytes("I;16B", (2, 1), np.array([257 * 7, 65535], dtype=">u2").tobytes())
    assert to_rgb_array(be)[0, :, 0].tolist() == [7, 255]
    i32 = Image.fromarray(np.array([[514, 65535]], dtype=np.int32), mode="I")
    assert to_rgb_array(i32)[0, :, 1].tolist() == [2, 255]
    i32_wide = Image.fromarray(np.array([[-2 ** 31, 2 ** 31 - 1]], dtype=np.int32), mode="I")
    assert to_rgb_array(i32_wide)[0, :, 2].tolist() == [0, 255]
    f = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), mode="F")
    assert to_rgb_array(f)[0, :, 0].tolist() == [0, 128, 255]
    f_wide = Image.fromarray(np.array([[-2.0, 0.0, 2.0]], dtype=np.float32), mode="F")
    assert to_rgb_array(f_wide)[0, :, 0].tolist() == [0, 128, 255]  # min-max, not clipped


def test_cmyk(tmp_path):
    Image.new("CMYK", (2, 2), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=100)
    out = read_image_rgb(tmp_path / "c.jpg")
    _check(out, (2, 2, 3))
    assert out[0, 0, 0] > 230 and out[0, 0, 1] < 25 and out[0, 0, 2] < 25  # red


def _exif_jpeg(path, orientation):
    """A 40 x 20 (W x H) JPEG: left half red, right half blue, with an EXIF orientation tag."""
    a = np.zeros((20, 40, 3), dtype=np.uint8)
    a[:, :20] = (255, 0, 0)
    a[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(a).save(path, quality=98, exif=exif.tobytes())


def _color(px):
    return "red" if px[0] > 200 and px[2] < 60 else "blue" if px[2] > 200 and px[0] < 60 else f"?{px}"


@pytest.mark.parametrize(
    "orientation, shape, where_red, where_blue",
    [
        (1, (20, 40, 3), (10, 5), (10, 35)),    # as stored
        (3, (20, 40, 3), (10, 35), (10, 5)),    # rotated 180: red on the right
        (6, (40, 20, 3), (5, 10), (35, 10)),    # stored left column is the displayed top
        (8, (40, 20, 3), (35, 10), (5, 10)),    # stored left column is the displayed bottom
    ],
)
def test_exif_orientation_applied(tmp_path, orientation, shape, where_red, where_blue):
    path = tmp_path / f"o{orientation}.jpg"
    _exif_jpeg(path, orientation)
    with Image.open(path) as raw:
        assert raw.size == (40, 20) and raw.getexif()[0x0112] == orientation
    out = read_image_rgb(path)
    _check(out, shape)
    assert _color(out[where_red]) == "red" and _color(out[where_blue]) == "blue"


def test_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.png"
    with pytest.raises(FileNotFoundError, match="nope.png"):
        read_image_rgb(missing)
    with pytest.raises(IsADirectoryError, match=str(tmp_path.name)):
        read_image_rgb(tmp_path)
    text = tmp_path / "notes.png"
    text.write_text("this is not an image")
    with pytest.raises(ImageReadError, match="notes.png"):
        read_image_rgb(text)
    Image.fromarray(np.full((64, 64, 3), 90, dtype=np.uint8)).save(tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageReadError, match="cut.png"):
        read_image_rgb(tmp_path / "cut.png")


def test_parse_vocabulary():
    assert parse_vocabulary("cat, dog, grass; lawn, sky") == ["cat", "dog", "grass, lawn", "sky"]
    assert parse_vocabulary("  tv   monitor ; screen\nperson;people ") == ["tv monitor, screen", "person, people"]
    assert parse_vocabulary("cat") == ["cat"]


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty vocabulary"),
        ("   ", "empty vocabulary"),
        ("cat,,dog", "empty class at position 2"),
        ("cat, dog,", "empty class at position 3"),
        ("cat; , dog", "empty synonym"),
        ("cat, dog, Cat", "duplicate name 'Cat'"),
        ("cat; kitty, dog; kitty", "duplicate name 'kitty'"),
    ],
)
def test_parse_vocabulary_errors(text, match):
    with pytest.raises(VocabularyError, match=match):
        parse_vocabulary(text)

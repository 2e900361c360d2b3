"""The pieces of `pathtwt heatmap` and `tile --roi` that need no slide: ROI polygons read
the way QuPath writes them, the tile grid with overlaps, the QuPath GeoJSON writer, the
pyramidal TIFF, and the memory bound of drawing a 20,000-tile slide."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from pathtwt.errors import PathtwtError
from pathtwt.explain import geojson
from pathtwt.explain.grid import attention_grid, rank_scores
from pathtwt.explain.heatmap import Canvas, blend, canvas_for, colour_table, compose, score_layer
from pathtwt.wsi.roi import Region, is_excluded_class, parse_roi, points_in_region, points_in_roi, read_roi


def _square(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]


def test_point_in_polygon_respects_holes_and_concavity():
    # an L-shaped exterior with a square hole in its long arm
    exterior = np.array([[0, 0], [100, 0], [100, 30], [30, 30], [30, 100], [0, 100]], float)
    hole = np.array([[5, 5], [20, 5], [20, 20], [5, 20]], float)
    region = Region(rings=(exterior, hole))
    points = np.array([[50, 10], [50, 50], [10, 10], [25, 25], [10, 90], [150, 10]], float)
    assert points_in_region(points, region).tolist() == [True, False, False, True, True, False]


def test_qupath_export_with_ignore_class_is_read_as_include_and_exclude(tmp_path):
    """QuPath's exportObjectsToGeoJson without FEATURE_COLLECTION writes a bare list of
    Features; "Ignore*" and "Exclude" areas are excluded, "Region*" and unclassified
    areas included, points ignored."""
    features = [
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [_square(0, 0, 100, 100)]},
         "properties": {"objectType": "annotation", "classification": {"name": "Region*", "color": [0, 0, 180]}}},
        {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [_square(40, 40, 60, 60)]},
         "properties": {"objectType": "annotation", "classification": {"name": "Ignore*", "color": [180, 180, 180]}}},
        {"type": "Feature", "geometry": {"type": "MultiPolygon", "coordinates": [[_square(200, 0, 220, 20)]]},
         "properties": {"objectType": "annotation"}},
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [5, 5]}, "properties": {}},
    ]
    path = tmp_path / "a.geojson"
    path.write_text(json.dumps(features))
    roi = read_roi(path)
    assert [r.excluded for r in roi.regions] == [False, True, False] and roi.ignored == 1
    inside = points_in_roi(np.array([[10, 10], [50, 50], [210, 10], [150, 150]], float), roi)
    assert inside.tolist() == [True, False, True, False]
    assert is_excluded_class("Exclude") and is_excluded_class("ignore") and not is_excluded_class("Region*")


def test_only_excluded_regions_keep_everything_else():
    roi = parse_roi({"type": "Feature", "properties": {"classification": {"name": "Exclude"}},
                     "geometry": {"type": "Polygon", "coordinates": [_square(0, 0, 10, 10)]}}, "x.geojson")
    assert points_in_roi(np.array([[5, 5], [50, 50]], float), roi).tolist() == [False, True]


@pytest.mark.parametrize("text,message", [
    ("{not json", "invalid JSON"),
    (json.dumps({"type": "FeatureCollection", "features": []}), "no polygon"),
    (json.dumps([{"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}, "properties": {}}]),
     "point/line/detection/tile objects only"),
    (json.dumps({"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 1]]]}}),
     "fewer than 3"),
    (json.dumps({"hello": 1}), "not GeoJSON"),
])
def test_bad_geojson_is_one_line_naming_the_file(tmp_path, text, message):
    path = tmp_path / "bad.geojson"
    path.write_text(text)
    with pytest.raises(PathtwtError) as err:
        read_roi(path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_overlapping_tiles_are_averaged_on_the_grid():
    # stride 50, side 100: the two tiles overlap on one cell column
    grid = attention_grid(np.array([[0, 0], [50, 0]]), np.array([1.0, 3.0]), side=100)
    assert grid.shape == (2, 3)
    assert grid[0].tolist() == [1.0, 2.0, 3.0] and grid[1].tolist() == [1.0, 2.0, 3.0]


def test_rank_scores_orders_and_ties():
    assert rank_scores(np.array([0.2, 0.1, 0.2, 0.5])).tolist() == [0.5, 0.0, 0.5, 1.0]


def test_geojson_tiles_follow_qupath_conventions_and_attention_order():
    """QuPath's reader (qupath-core qupath/lib/io/PathObjectTypeAdapters.java) takes
    properties.objectType "tile"/"annotation", classification {name, color}, measurements
    as a name -> value object (since v0.4.0) and a UUID id; coordinates are level-0 pixels
    from the top left (qupath-docs docs/advanced/exporting_annotations.md, "Units and origin")."""
    coords = np.array([[0, 0], [256, 0], [0, 256]])
    attention = np.array([0.2, 0.5, 0.3])
    tissue = [[np.array([[0, 0], [600, 0], [600, 600], [0, 600]], float)]]
    features = geojson.slide_features("s", coords=coords, side=256, attention=attention, probs=np.array([0.3, 0.7]),
                                      tissue=tissue)
    assert features[0]["properties"]["objectType"] == "annotation"
    assert features[0]["properties"]["measurements"] == {"p0": 0.3, "p1": 0.7}
    tiles = [f for f in features if f["properties"]["objectType"] == "tile"]
    assert len(tiles) == 3
    assert tiles[1]["geometry"]["coordinates"][0] == [[256, 0], [512, 0], [512, 256], [256, 256], [256, 0]]
    assert all(t["properties"]["classification"] == {"name": "class 1", "color": geojson.CLASS_COLOURS[1]} for t in tiles)
    values = [t["properties"]["measurements"]["attention"] for t in tiles]
    assert np.argsort(values).tolist() == np.argsort(attention).tolist()
    import uuid

    assert len({uuid.UUID(f["id"]) for f in features}) == len(features)


def test_a_20000_tile_slide_draws_in_bounded_memory():
    """200 x 100 tiles of 512 level-0 px (256 px at 0.5 um/px on a 0.25 um/px scan) drawn at
    8 um/px: the score layer and blending allocate about 4 bytes per canvas pixel (the
    upsampled scores) plus strip temporaries (measured: 4.3 bytes per pixel), whatever the
    number of tiles."""
    xs, ys = np.meshgrid(np.arange(200) * 512, np.arange(100) * 512)
    coords = np.stack([xs.ravel(), ys.ravel()], axis=1)
    assert len(coords) == 20_000
    canvas = canvas_for((200 * 512, 100 * 512), 0.25, 8.0)
    background = np.full((canvas.height, canvas.width, 3), 240, np.uint8)
    values = rank_scores(np.random.default_rng(0).random(len(coords)))
    table = colour_table("turbo")
    tracemalloc.start()
    layer = score_layer(canvas, coords, values, 512)
    blend(background, layer, table)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    pixels = canvas.width * canvas.height
    assert pixels == 3200 * 1600
    assert peak < 5 * pixels, f"peak {peak / 1e6:.1f} MB for {pixels / 1e6:.1f} MP"
    assert (background != 240).any(axis=2).mean() > 0.99  # every tile drawn


def test_canvas_too_large_says_which_mpp_fits():
    with pytest.raises(PathtwtError, match=r"use --mpp \d"):
        canvas_for((200_000, 100_000), 0.25, 0.5)
    assert canvas_for((1000, 1000), 0.5, 0.1).mpp == 0.5  # never finer than the slide


def test_scores_land_on_their_tiles():
    canvas = Canvas(width=100, height=100, scale=0.1, mpp=5.0)
    layer = score_layer(canvas, np.array([[0, 0], [500, 500]]), np.array([0.0, 1.0]), 500)
    background = np.full((100, 100, 3), 200, np.uint8)
    blend(background, layer, colour_table("gray"), alpha=1.0)
    assert (background[10, 10] == 0).all() and (background[60, 60] == 255).all()
    assert (background[10, 60] == 200).all()  # no tile there: the slide untouched


def test_a_small_slide_is_enlarged_by_a_whole_factor_and_a_large_one_is_not():
    small = np.zeros((100, 80, 3), np.uint8)
    small[:50, :40] = 255  # the top-left quarter white: it must stay the top-left quarter
    out = compose(small, ["slide"], "turbo", "percentile", min_height=420)
    assert out.shape[0] == 420  # 4 x 100 = 400 px of slide, the panel sets the height
    assert (out[:200, :160] == 255).all() and (out[200:400, 160:320] == 0).all()
    large = np.full((500, 300, 3), 7, np.uint8)
    out = compose(large, ["slide"], "turbo", "percentile", min_height=420)
    assert out.shape[0] == 500 and (out[:500, :300] == 7).all()


def test_pyramidal_tiff_opens_in_tiffslide_with_levels_and_mpp(tmp_path):
    tiffslide = pytest.importorskip("tiffslide")
    from pathtwt.explain.tiff import write_pyramid_tiff

    image = np.random.default_rng(0).integers(0, 255, (1300, 900, 3), dtype=np.uint8)
    write_pyramid_tiff(tmp_path / "h.tif", image, mpp=2.0)
    with tiffslide.TiffSlide(tmp_path / "h.tif") as slide:
        assert slide.level_dimensions[0] == (900, 1300) and slide.level_count == 3
        assert float(slide.properties["tiffslide.mpp-x"]) == pytest.approx(2.0)
        assert (np.asarray(slide.read_region((0, 0), 0, (64, 64)))[..., :3] == image[:64, :64]).all()


def test_report_links_the_workflow_heatmaps_and_copies_them(tmp_path):
    from pathtwt.report.html import heatmaps_html

    folder = tmp_path / "results" / "heatmaps" / "h0-mini" / "twt-4" / "isup" / "abmil" / "panda"
    folder.mkdir(parents=True)
    for suffix in (".heatmap.png", ".top_tiles.png", ".geojson"):
        (folder / f"p6{suffix}").write_bytes(b"x")
    page = heatmaps_html(tmp_path / "results", tmp_path / "report")
    assert "Attention heatmaps" in page and "p6" in page and "h0-mini / twt-4" in page
    for suffix in (".heatmap.png", ".top_tiles.png", ".geojson"):
        href = f"figures/heatmaps/h0-mini/twt-4/isup/abmil/panda/p6{suffix}"
        assert f'href="{href}"' in page and (tmp_path / "report" / href).is_file()
    assert heatmaps_html(tmp_path / "nothing", tmp_path / "report") == ""


def test_report_lists_one_slides_heatmaps_together_teacher_first(tmp_path):
    from pathtwt.report.html import heatmaps_html

    root = tmp_path / "results" / "heatmaps" / "vit"
    for variant in ("twt-4", "uncompressed", "twt-6"):
        for slide in ("s2", "s1"):
            folder = root / variant / "isup" / "abmil" / "panda"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{slide}.heatmap.png").write_bytes(b"x")
    page = heatmaps_html(tmp_path / "results", tmp_path / "report")
    rows = [(r.split("<td>")[3].split("<")[0], r.split("<td>")[4].split("<")[0]) for r in page.split("<tr>")[2:]]
    assert rows == [(s, f"vit / {v}") for s in ("s1", "s2") for v in ("uncompressed", "twt-4", "twt-6")]


def test_predict_takes_folders_of_slides(tmp_path):
    from pathtwt.cli.predict import slide_list

    for name in ("a.svs", "b.jpeg", "notes.txt", ".tmp.svs"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.tiff").write_bytes(b"")
    assert slide_list([str(tmp_path)]) == {"a": tmp_path / "a.svs", "b": tmp_path / "b.jpeg"}
    with pytest.raises(PathtwtError, match="two slides with the id 'a'"):
        slide_list([str(tmp_path), str(tmp_path / "other")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(PathtwtError, match="no slide files"):
        slide_list([str(tmp_path / "empty")])


def _legend_texts(lines):
    from pathtwt.explain.heatmap import legend_figure

    fig = legend_figure(420, "turbo", "rank", lines)
    renderer = fig.canvas.get_renderer()
    width = fig.get_window_extent().x1
    texts = [t for t in fig.texts if t.get_text()]
    extents = [t.get_window_extent(renderer) for t in texts]
    return "\n".join(t.get_text() for t in texts), width, extents


def test_every_class_probability_fits_the_legend_panel():
    from pathtwt.explain.heatmap import probability_lines

    probs = [0.01, 0.02, 0.03, 0.04, 0.05, 0.85]
    lines = probability_lines(probs)
    text, width, extents = _legend_texts(["slide-001", "abmil head: predicted class 5", *lines, "13 tiles"])
    for c, p in enumerate(probs):
        assert f"p{c} {p:.2f}" in text
    assert all(0 <= e.x0 and e.x1 <= width for e in extents), [(e.x0, e.x1, width) for e in extents]


def test_rank_scale_states_the_raw_range_and_warns_when_nearly_uniform():
    from pathtwt.explain.heatmap import NEAR_UNIFORM_RATIO, attention_range_lines

    flat = np.linspace(0.0744, 0.0791, 13)
    lines = attention_range_lines(flat, "rank")
    assert "0.0744-0.0791" in lines[0] and any(f"< {NEAR_UNIFORM_RATIO:g}: nearly uniform" in line for line in lines)
    spread = attention_range_lines(np.array([0.01, 0.5]), "rank")
    assert "0.01-0.5" in spread[0] and "nearly uniform" not in " ".join(spread)
    assert attention_range_lines(flat, "max") == []  # the bar shows raw attention / max already
    text, width, extents = _legend_texts(["s", *lines])
    assert "nearly uniform" in text and all(e.x1 <= width for e in extents)


def test_a_top_k_over_half_the_tiles_says_what_it_gave():
    from pathtwt.explain.montage import top_bottom, top_k_note

    top, bottom = top_bottom(np.arange(13.0), 8)
    assert len(top) == len(bottom) == 6
    assert top_k_note(8, 13) == "top-k 8 asked, 6+6 shown of 13 tiles"
    assert top_k_note(6, 13) is None

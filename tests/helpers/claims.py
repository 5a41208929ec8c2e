"""Claims for this process's side of a product shared from both ends (fp8_workers.from_the_front's
stand-ins): which tiles this process takes, so a test can leave every tile to the helper, or none."""


def this_process_takes_none(claims):
    """A claim for this process's side that leaves every tile to the helper."""
    return lambda: None


def this_process_takes_all(claims):
    """A claim for this process's side that takes every tile, the helper's count set so it stops."""
    tiles = iter(range(int(claims[1])))

    def take():
        tile = next(tiles, None)
        if tile is not None:
            claims[0] = tile + 1
        return tile
    return take

"""A loopback stand-in for Binance USD-M REST speaking the documented formats."""

from __future__ import annotations

import numpy as np
from aiohttp import web

TF_MS = 900_000


class FakeBinance:
    """Serves klines, fundingRate and openInterestHist from arrays, paged like Binance."""

    def __init__(self, rows: np.ndarray, funding: np.ndarray, oi: np.ndarray) -> None:
        self.rows, self.funding, self.oi = rows, funding, oi
        self.requests: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/fapi/v1/klines", self.klines)
        app.router.add_get("/fapi/v1/fundingRate", self.funding_rate)
        app.router.add_get("/futures/data/openInterestHist", self.oi_hist)
        return app

    def _window(self, req: web.Request, times: np.ndarray, max_limit: int) -> np.ndarray:
        self.requests.append(req.path)
        q = req.query
        limit = min(int(q.get("limit", 500)), max_limit)
        lo, hi = int(q.get("startTime", 0)), int(q.get("endTime", 2**62))
        return np.flatnonzero((times >= lo) & (times <= hi))[:limit]

    def _check(self, req: web.Request) -> web.Response | None:
        if req.query.get("symbol") != "BTCUSDT":
            return web.json_response({"code": -1121, "msg": "Invalid symbol."}, status=400)
        return None

    async def klines(self, req: web.Request) -> web.Response:
        bad = self._check(req)
        if bad:
            return bad
        idx = self._window(req, self.rows[:, 0], 1500)
        out = [
            [
                int(r[0]),
                *(f"{x:.8f}" for x in r[1:6]),
                int(r[0]) + TF_MS - 1,
                "1.0",
                10,
                "0.5",
                "0.5",
                "0",
            ]
            for r in self.rows[idx]
        ]
        return web.json_response(out)

    async def funding_rate(self, req: web.Request) -> web.Response:
        bad = self._check(req)
        if bad:
            return bad
        idx = self._window(req, self.funding[:, 0], 1000)
        out = [
            {
                "symbol": "BTCUSDT",
                "fundingRate": f"{r[1]:.8f}",
                "fundingTime": int(r[0]),
                "markPrice": "1.0",
            }
            for r in self.funding[idx]
        ]
        return web.json_response(out)

    async def oi_hist(self, req: web.Request) -> web.Response:
        bad = self._check(req)
        if bad:
            return bad
        idx = self._window(req, self.oi[:, 0], 500)
        out = [
            {
                "symbol": "BTCUSDT",
                "sumOpenInterest": "1.0",
                "sumOpenInterestValue": f"{r[1]:.8f}",
                "timestamp": str(int(r[0])),  # the docs show a string; parse either way
            }
            for r in self.oi[idx]
        ]
        return web.json_response(out)

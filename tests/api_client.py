"""The gradio_client the API tests talk to a served app with."""

from __future__ import annotations

from typing import Any


def local_client(url: str, **kwargs: Any):
    """A ``gradio_client.Client`` for an app a test serves over plain http on loopback.

    ``ssl_verify=False`` because gradio_client opens a new httpx client for each request, and each of those
    builds a certificate-verifying SSL context (certifi's bundle parsed) that plain http never uses: measured
    here, that was about two thirds of an API call's CPU, client and served app together.
    """
    from gradio_client import Client

    kwargs.setdefault("verbose", False)
    return Client(url, ssl_verify=False, **kwargs)

"""The form factor of a device from its User-Agent (phone, tablet, desktop, bot, unknown),
parsed with ua-parser and its Rust accelerator, cached."""

from __future__ import annotations

import functools
import logging
import re

from ua_parser import (
    BasicResolver,
    Domain,
    Parser,
    RegexResolver,
    load_builtins,
    load_lazy_builtins,
)

logger = logging.getLogger("chat.tiers")

PHONE = "phone"
TABLET = "tablet"
DESKTOP = "desktop"
BOT = "bot"
UNKNOWN = "unknown"
DEVICE_CLASSES = (PHONE, TABLET, DESKTOP, BOT, UNKNOWN)


def build_parser(resolver: str = "best") -> Parser:
    """A ua-parser Parser without its own cache (device_class caches the result instead).

    "rust" needs ua-parser-rs; "python" is the pure-Python resolver (slow, for comparison);
    "best" takes the Rust one when it is installed.
    """
    if resolver in ("rust", "best") and RegexResolver is not None:
        # The Rust resolver compiles the regexes itself, so the lazy matchers (which only
        # carry the patterns) are enough and load faster.
        return Parser(RegexResolver(load_lazy_builtins()))
    if resolver == "rust":
        raise RuntimeError("ua-parser-rs is not installed")
    return Parser(BasicResolver(load_builtins()))


@functools.cache
def _parser() -> Parser:
    if RegexResolver is None:
        logger.warning("ua-parser-rs is not installed: parsing User-Agents in pure Python (slow)")
    return build_parser("best")


def resolver_name() -> str:
    """Which ua-parser resolver device_class uses: "ua-parser-rs" or "pure-python"."""
    return "ua-parser-rs" if RegexResolver is not None else "pure-python"


# Smart TVs, streaming sticks and consoles: a big screen, so they are treated as desktops.
# ua-parser knows many of them as devices; these tokens catch the rest (and Android TVs, which
# look like Android tablets otherwise). Fire TV models are AFT…, written in capitals.
_TV_OR_CONSOLE = re.compile(
    r"(?i:SMART-?TV|SmartTV|HbbTV|NetCast|Web0S|webOS\.TV|\bCrKey/|BRAVIA|Android ?TV|GoogleTV"
    r"|\bTV Safari|\bRoku|AppleTV|PlayStation|\bXbox\b|Nintendo)"
    r"|;\s?AFT[A-Z0-9]{1,5}[\s);]"
)
_TV_OS = frozenset({"Web0S", "webOS TV", "Chromecast Linux", "Roku", "tvOS"})
_TV_DEVICE = re.compile(r"TV|Chromecast|PlayStation|Xbox|Nintendo|Roku", re.IGNORECASE)

_PHONE_OS = frozenset(
    {
        "KaiOS",
        "Windows Phone",
        "Windows Mobile",
        "BlackBerry OS",
        "Symbian OS",
        "Symbian^3",
        "Firefox OS",
        "Bada",
        "MeeGo",
        "Maemo",
        "Sailfish",
    }
)
# Feature-phone and old-smartphone tokens that ua-parser does not always turn into an OS.
_PHONE_TOKENS = re.compile(
    r"MIDP|J2ME|CLDC|Symbian|Series ?[46]0|IEMobile|Windows Phone|BlackBerry|\bBB10\b|KAIOS",
    re.IGNORECASE,
)
# Mozilla's advice for "is it mobile": the substring "Mobi" anywhere in the UA.
_MOBILE_TOKEN = re.compile(r"Mobi")
_ANDROID_TABLET_TOKEN = re.compile(r"\bTablet\b")
_DESKTOP_OS_PREFIXES = (
    "Windows",
    "Mac OS X",
    "Linux",
    "Chrome OS",
    "Ubuntu",
    "Fedora",
    "Debian",
    "FreeBSD",
    "OpenBSD",
    "NetBSD",
    "Solaris",
    "Red Hat",
    "SUSE",
    "Mint",
)
_DESKTOP_TOKENS = re.compile(r"Windows NT|Macintosh|\bX11\b|\bCrOS\b")
# Headless browsers are automation, not people; ua-parser reports them as a browser family.
_AUTOMATION_FAMILIES = frozenset({"HeadlessChrome", "PhantomJS"})
# A crawler's `…bot/2.1` token, for the ones ua-parser's device rules miss (its pure-Python
# resolver misses Applebot, the Rust one does not). Not a bare "bot": Cubot makes phones.
_BOT_TOKEN = re.compile(r"(?i)(?:bot|crawler|spider)/\d")
# `product/version` with no browser around it: curl, Wget, python-requests, Go-http-client…
_CLIENT_LIBRARY = re.compile(r"[A-Za-z][\w.+-]*/\d")


def classify_device(user_agent: str, parser: Parser) -> str:
    """The form factor of a User-Agent: phone, tablet, desktop, bot or unknown (uncached).

    ua-parser says which OS, device and browser family a UA names, not how big the screen is;
    these rules turn that (and a few raw tokens) into a form factor. The order matters: bots
    first (Googlebot's smartphone crawler sends a phone UA), TVs before Android (Android TVs
    lack "Mobile" like tablets), iPad before iPhone, Kindle before Android (the first Kindle
    Fire said "Mobile Safari"), phone platforms before Android (Windows Phone claims Android).
    """
    ua = user_agent.strip()
    if not ua:
        return UNKNOWN
    result = parser(ua, Domain.ALL)
    browser = result.user_agent.family if result.user_agent else ""
    os_family = result.os.family if result.os else ""
    device = result.device.family if result.device else ""
    brand = (result.device.brand or "") if result.device else ""

    if device == "Spider" or browser in _AUTOMATION_FAMILIES or _BOT_TOKEN.search(ua):
        return BOT
    if (
        os_family in _TV_OS
        or brand == "Generic_Inettv"
        or _TV_DEVICE.search(device)
        or _TV_OR_CONSOLE.search(ua)
    ):
        return DESKTOP
    # iPadOS 13+ in its default desktop mode sends macOS Safari's UA and lands in the desktop
    # branch below: indistinguishable, and harmless since tablets and desktops share a tier.
    # In-app browsers on iPad name it elsewhere in the UA (FBDV/iPad…), hence the raw check.
    if device.startswith("iPad") or "iPad" in ua:
        return TABLET
    if os_family == "iOS" or device.startswith(("iPhone", "iPod")):
        return PHONE
    if (
        (brand == "Amazon" and device.startswith("Kindle"))
        or "Kindle" in ua
        or "Silk/" in ua
        or os_family == "BlackBerry Tablet OS"
        or device == "Generic Tablet"
    ):
        return TABLET
    if (
        os_family in _PHONE_OS
        or device in ("Generic Smartphone", "Generic Feature Phone")
        or browser in ("Opera Mini", "Opera Mobile")
        or _PHONE_TOKENS.search(ua)
    ):
        return PHONE
    if os_family == "Android" or "Android" in ua:
        # Android's own convention: phones put "Mobile" in the UA, tablets leave it out. This
        # covers Chrome's reduced UA ("Android 10; K"), WebViews ("; wv)") and in-app
        # browsers (WeChat, Facebook, Instagram, LINE, TikTok), which all keep the token.
        if _ANDROID_TABLET_TOKEN.search(ua):
            return TABLET
        return PHONE if _MOBILE_TOKEN.search(ua) else TABLET
    if _MOBILE_TOKEN.search(ua):
        return PHONE
    if os_family.startswith(_DESKTOP_OS_PREFIXES) or _DESKTOP_TOKENS.search(ua):
        return DESKTOP
    if not ua.startswith(("Mozilla/", "Opera/")) and _CLIENT_LIBRARY.match(ua):
        return BOT
    return UNKNOWN


@functools.lru_cache(maxsize=4096)
def device_class(user_agent: str) -> str:
    """The form factor of a User-Agent (cached: the same few hundred UAs come back all day)."""
    return classify_device(user_agent, _parser())

"""The one place a URL's password is hidden: every message, log line and status that may name a
store or catalog URL (``s3://KEY:SECRET@bucket``, ``postgresql://user:pw@host/db``) goes through
``masked``, so a secret typed into ``corpus.yaml`` or the environment is never printed or kept."""

import re

# scheme://user:secret@ - the secret runs to the first '@' (an AWS secret key may hold '/' and '+')
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s'\"]*):[^@\s'\"]*@")
MASK = "***"


def masked(text: str) -> str:
    """``text`` with every ``scheme://user:password@`` written ``scheme://user:***@``."""
    return _USERINFO.sub(rf"\g<head>:{MASK}@", text)

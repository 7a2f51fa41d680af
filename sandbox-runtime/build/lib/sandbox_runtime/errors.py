"""JSON error type shared by every route: `{code, message}` as in the sandboxd spec."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, str]:
        # `detail` mirrors FastAPI's own error key so clients written for either shape see a message.
        return {"code": self.code, "message": self.message, "detail": self.message}


def bad_request(message: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "PERMISSION_DENIED", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", message)


def conflict(message: str) -> ApiError:
    return ApiError(409, "CONFLICT", message)

"""The app's widgets. None of them imports torch: they read plain attributes of what the workers post."""
from .chat_view import AssistantMessage, ChatView, NoticeMessage, TokenView, UserMessage
from .inspector import Inspector
from .prompt import PromptInput, PromptArea
from .status_bar import StatusBar

__all__ = ["AssistantMessage", "ChatView", "Inspector", "NoticeMessage", "PromptArea", "PromptInput", "StatusBar",
           "TokenView", "UserMessage"]

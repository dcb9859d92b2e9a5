-- wrk script: the streaming variant of chat.lua ("stream": true, SSE reply).
-- Same arguments as chat.lua; `stream` is implied.
--   wrk -c32 -t2 -d10s -s bench/wrk/chat-stream.lua http://127.0.0.1:8080/v1/chat/completions
CHAT_STREAM = true
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "chat.lua")

-- Managed by engine-ctl (the gateway's Lua): held requests and GET /v1/models.
-- content-sha256: {{ content_hash }}
local HOLD_MS = {{ hold_s * 1000 }}
local STEP_MS = 250
local CAP = {{ hold_cap }}
local PREFIX = "{{ backend_prefix }}"
local held = {}
local scopes = Map.new("scopes.map", Map._str)

-- The scaler's wake (engine-ctl-scaler on port {{ wake_port }}: this host's own at 127.0.0.1, else the first
-- gateway host's): a held request pokes the first that listens with `wake <deployment>` and never waits for an
-- answer; the scaler starts one replica per deployment (single-flight) whether or not the client stays (with a
-- scaler on every gateway host, one that does not act passes the wake to the one that does). Poked again every
-- WAKE_EVERY_MS while held, in case the scaler restarted.
local WAKE_ADDRESSES = { {% for a in wake_addresses %}"{{ a }}"{{ ", " if not loop.last }}{% endfor %} }
local WAKE_PORT = {{ wake_port }}
local WAKE_EVERY_MS = 5000
local function wake(name)
    for _, address in ipairs(WAKE_ADDRESSES) do
        local s = core.tcp()
        s:settimeout(1)
        local heard = s:connect(address, WAKE_PORT)
        if heard then
            s:send("wake " .. string.sub(name, #PREFIX + 1) .. "\n")
        end
        s:close()
        if heard then
            return
        end
    end
end

local function serving(name)
    local backend = core.backends[name]
    if backend == nil then
        return false
    end
    for _, server in pairs(backend.servers) do
        local status = server:get_stats().status or ""
        if string.sub(status, 1, 2) == "UP" then
            return true
        end
    end
    return false
end

-- Hold a request while its deployment has no serving replica: let it through as soon as one serves, or
-- set txn.hold (the configuration answers 503 with Retry-After: 5) after HOLD_MS or beyond CAP held.
core.register_action("hold", { "http-req" }, function(txn)
    local name = txn:get_var("txn.backend")
    if name == nil or serving(name) then
        return
    end
    local count = held[name] or 0
    if count >= CAP then
        txn:set_var("txn.hold", "full")
        return
    end
    held[name] = count + 1
    local waited = 0
    wake(name)
    while waited < HOLD_MS do
        core.msleep(STEP_MS)
        waited = waited + STEP_MS
        if waited % WAKE_EVERY_MS == 0 then
            wake(name)
        end
        if serving(name) then
            held[name] = held[name] - 1
            return
        end
    end
    held[name] = held[name] - 1
    txn:set_var("txn.hold", "timeout")
end, 0)

-- A JSON body nested deeper than MAX_DEPTH is refused (400) before it reaches an engine: an engine's JSON parser
-- may recurse once a level (llama-server's crashes with SIGSEGV past about 100,000 levels). The scan jumps from one
-- bracket or quote to the next (string.find), so a request costs one pass over its body's brackets, and stops at
-- the first level past the bound; brackets inside strings do not count.
local MAX_DEPTH = 64
local find, byte = string.find, string.byte
local function too_deep(body)
    local depth, pos = 0, 1
    while true do
        local at = find(body, '[%[%]{}"]', pos)
        if at == nil then
            return false
        end
        local c = byte(body, at)
        pos = at + 1
        if c == 34 then -- a string: on to its closing quote, past escaped characters
            while true do
                local q = find(body, '["\\]', pos)
                if q == nil then
                    return false
                end
                if byte(body, q) == 92 then
                    pos = q + 2
                else
                    pos = q + 1
                    break
                end
            end
        elseif c == 91 or c == 123 then
            depth = depth + 1
            if depth > MAX_DEPTH then
                return true
            end
        else
            depth = depth - 1
        end
    end
end

core.register_action("depth", { "http-req" }, function(txn)
    local body = txn.f:req_body()
    if body ~= nil and #body > MAX_DEPTH * 2 and too_deep(body) then
        txn:set_var("txn.too_deep", MAX_DEPTH)
    end
end, 0)

-- GET /v1/models: every deployment the caller's key may use (scopes.map holds "<key>/<deployment>").
core.register_service("models", "http", function(applet)
    local key = applet:get_var("txn.key") or ""
    local names = {}
    for name, _ in pairs(core.backends) do
        if string.sub(name, 1, #PREFIX) == PREFIX then
            local deployment = string.sub(name, #PREFIX + 1)
            if scopes:lookup(key .. "/" .. deployment) ~= nil then
                table.insert(names, deployment)
            end
        end
    end
    table.sort(names)
    local items = {}
    for _, deployment in ipairs(names) do
        table.insert(items, '{"id":"' .. deployment .. '","object":"model","created":0,"owned_by":"engine-ctl"}')
    end
    local body = '{"object":"list","data":[' .. table.concat(items, ",") .. "]}"
    applet:set_status(200)
    applet:add_header("content-type", "application/json")
    applet:add_header("content-length", string.len(body))
    applet:start_response()
    applet:send(body)
end)

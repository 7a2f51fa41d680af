-- ArgoCD health of a Sandbox (agents.x-k8s.io), from its Ready and Suspended conditions. Install it as
-- `resource.customizations.health.agents.x-k8s.io_Sandbox` in argocd-cm (see the chart's README).
local hs = { status = "Progressing", message = "waiting for the operator" }
local broken = { PodFailed = true, MultiplePods = true, ReconcilerError = true, SandboxExpired = true }
if obj.spec ~= nil and obj.spec.operatingMode == "Suspended" then
  hs.status = "Suspended"
  hs.message = "suspended (spec.operatingMode)"
end
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local ready = nil
local suspended = nil
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    ready = condition
  elseif condition.type == "Suspended" then
    suspended = condition
  end
end
if ready ~= nil and ready.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and ready.observedGeneration < obj.metadata.generation then
  hs.message = "the operator has not seen the latest change yet"
  return hs
end
if suspended ~= nil and suspended.status == "True" then
  hs.status = "Suspended"
  hs.message = suspended.message or "suspended"
  return hs
end
-- Suspended for idleness (spec.autoSuspendPolicy), its Pod still going: nothing to wait for either.
if ready ~= nil and ready.reason == "Suspended" then
  hs.status = "Suspended"
  hs.message = ready.message or "suspended"
  return hs
end
if ready == nil then
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
elseif broken[ready.reason] then
  hs.status = "Degraded"
end
hs.message = ready.reason .. ": " .. (ready.message or "")
return hs

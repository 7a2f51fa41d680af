-- ArgoCD health of a SandboxClaim (extensions.agents.x-k8s.io). A claim that names something missing or
-- invalid will not fix itself: Degraded. Install it as
-- `resource.customizations.health.extensions.agents.x-k8s.io_SandboxClaim` in argocd-cm (see the chart's README).
local hs = { status = "Progressing", message = "waiting for the operator" }
local broken = {
  TemplateNotFound = true, WarmPoolNotFound = true, EnvVarsInjectionRejected = true,
  VolumeClaimTemplatesError = true, InvalidMetadata = true, ReconcilerError = true,
  ClaimExpired = true, SandboxExpired = true,
}
if obj.status == nil or obj.status.conditions == nil then
  return hs
end
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    if condition.observedGeneration ~= nil and obj.metadata.generation ~= nil
        and condition.observedGeneration < obj.metadata.generation then
      hs.message = "the operator has not seen the latest change yet"
      return hs
    end
    if condition.status == "True" then
      hs.status = "Healthy"
    elseif broken[condition.reason] then
      hs.status = "Degraded"
    elseif condition.reason == "Suspended" then
      -- Its Sandbox sleeps for idleness (autoSuspendPolicy): nothing to wait for until a request wakes it.
      hs.status = "Suspended"
    end
    hs.message = condition.reason .. ": " .. (condition.message or "")
    if obj.status.sandbox ~= nil and obj.status.sandbox.name ~= nil and condition.status == "True" then
      hs.message = "bound to Sandbox " .. obj.status.sandbox.name
    end
    return hs
  end
end
return hs

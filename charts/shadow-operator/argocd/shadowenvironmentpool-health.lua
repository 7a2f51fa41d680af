-- ArgoCD health of a ShadowEnvironmentPool (shadow.dev): Healthy once every instance it keeps is started
-- (status.readyReplicas = spec.replicas), Progressing while instances start, Degraded when its
-- SandboxTemplate is missing (it will not fix itself). Install it as
-- `resource.customizations.health.shadow.dev_ShadowEnvironmentPool` in argocd-cm (see the chart's README).
local hs = { status = "Progressing", message = "waiting for the operator" }
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
    elseif condition.reason == "TemplateNotFound" then
      hs.status = "Degraded"
    end
    hs.message = condition.reason .. ": " .. (condition.message or "")
    return hs
  end
end
return hs

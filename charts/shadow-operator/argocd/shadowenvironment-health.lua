-- ArgoCD health of a ShadowEnvironment, from its conditions and failure code. Install it as
-- `resource.customizations.health.shadow.dev_ShadowEnvironment` in argocd-cm (see the chart's values).
local hs = { status = "Progressing", message = "waiting for the operator" }
if obj.status == nil then
  return hs
end
if obj.status.failure ~= nil then
  hs.status = "Degraded"
  hs.message = obj.status.failure.code .. ": " .. (obj.status.failure.message or "")
  return hs
end
local ready = nil
local verified = nil
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    elseif condition.type == "Verified" then
      verified = condition
    end
  end
end
if ready ~= nil and ready.observedGeneration ~= nil and obj.metadata.generation ~= nil
    and ready.observedGeneration < obj.metadata.generation then
  hs.message = "the operator has not seen the latest change yet"
  return hs
end
if ready ~= nil and ready.status == "True" then
  if verified ~= nil and verified.status == "False" then
    hs.status = "Degraded"
    hs.message = verified.message
    return hs
  end
  -- Ready comes before the verification has run: not Healthy until this generation's verdict is in.
  local verifying = obj.spec == nil or obj.spec.verify == nil or obj.spec.verify.enabled ~= false
  local verdict = obj.status.verdict
  if verifying and (verdict == nil or (verdict.observedGeneration ~= nil and obj.metadata.generation ~= nil
      and verdict.observedGeneration < obj.metadata.generation)) then
    hs.message = "Ready; waiting for the verdict"
    return hs
  end
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
if ready ~= nil then
  -- Suspended for idleness (spec.idleTimeoutSeconds): nothing to wait for until someone resumes it.
  if ready.reason == "Suspended" then
    hs.status = "Suspended"
  end
  hs.message = ready.reason .. ": " .. (ready.message or "")
end
return hs

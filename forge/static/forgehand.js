// Small progressive enhancements; every page works without this file.
// Copy buttons: <button data-copy="#id" aria-label="..."> copies that element's text with the
// clipboard API and says so in the nearest [data-copy-status] live region.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  const status = document.querySelector(button.dataset.copyStatus || "[data-copy-status]");
  if (!source) return;
  try {
    await navigator.clipboard.writeText(source.textContent.trim());
    if (status) status.textContent = "Copied to the clipboard.";
  } catch (err) {
    if (status) status.textContent = "Copying failed: select the text and copy it yourself.";
  }
});

// The start form (form[data-runtime-choice]) shows the fields of the chosen runtime only; without
// this file every runtime's fields show, each under its heading.
function showChosenRuntime(form) {
  const chosen = form.querySelector("input[name=runtime]:checked");
  for (const section of form.querySelectorAll("[data-runtime-fields]")) {
    section.hidden = !chosen || section.dataset.runtimeFields !== chosen.value;
  }
}
document.addEventListener("change", (event) => {
  const form = event.target.closest && event.target.closest("form[data-runtime-choice]");
  if (form && event.target.name === "runtime") showChosenRuntime(form);
});
const showAllChosenRuntimes = () => document.querySelectorAll("form[data-runtime-choice]").forEach(showChosenRuntime);
showAllChosenRuntimes();
window.addEventListener("pageshow", showAllChosenRuntimes); // the browser may restore another choice

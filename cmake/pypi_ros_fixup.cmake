# Included into every CMake project of the workspace (CMAKE_PROJECT_INCLUDE) when ROS 2 comes from
# the PyPI wheels. Those wheels were built in a manylinux container, and their exported CMake targets
# name that container's Python and numpy include directories (/opt/python/cp311-cp311/...), which do
# not exist here. At the end of configuration we point every imported target at this venv's Python
# and numpy headers instead. With an apt ROS install the paths are already right and nothing changes.
find_package(Python3 REQUIRED COMPONENTS Interpreter Development NumPy)

function(na_fix_pypi_ros_include_dirs)
  get_directory_property(_targets IMPORTED_TARGETS)
  foreach(_target IN LISTS _targets)
    get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(_dirs AND "${_dirs}" MATCHES "/opt/python/cp")
      string(REGEX REPLACE "/opt/python/cp[0-9]+-cp[0-9]+/include/python[0-9.]+"
        "${Python3_INCLUDE_DIRS}" _dirs "${_dirs}")
      string(REGEX REPLACE "/opt/python/cp[0-9]+-cp[0-9]+/lib/python[0-9.]+/site-packages/numpy/_core/include"
        "${Python3_NumPy_INCLUDE_DIRS}" _dirs "${_dirs}")
      set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
    endif()
  endforeach()
endfunction()

cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL na_fix_pypi_ros_include_dirs)
